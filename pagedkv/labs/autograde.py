"""Autograde a class several students at a time: ``make autograde JOBS=N`` (``python -m pagedkv autograde``).

nbgrader grades one student after another in one process, and its gradebook is one SQLite file, which two
nbgrader processes must not write at once. So the students are dealt into ``jobs`` batches; each batch is
graded by its own ``nbgrader autograde`` in its own copy of the course folder (the config, the gradebook,
``source/`` and ``release/``, and only that batch's ``submitted/`` folders), all batches at once; then each
batch's ``autograded/<student>/`` folders are moved into the course and its grades copied into the course's
gradebook (nbgrader's own API), one batch after another. ``make feedback`` then works as after a plain
``make autograde``. A batch that fails leaves the course as it was for its students, and its copy (with
nbgrader's log) is kept and named.

The batches' kernels talk to their nbgrader over Unix sockets, not TCP ports (``kernel_sockets``): jupyter_client
picks a kernel's TCP ports by binding port 0 and closing the socket before the kernel binds it, so two nbgraders
starting kernels at once can be handed the same port (seen in CI: zmq "Address already in use", the kernel dead
before its first reply).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

# What a batch's copy of the course holds besides its students' submissions (made by `make release`).
COPIED = ("nbgrader_config.py", "gradebook.db", "source", "release")


def students_of(course: Path, assignment: str) -> list[str]:
    """Every student with a submission of ``assignment`` in ``course/submitted/``, sorted."""
    submitted = course / "submitted"
    return sorted(p.name for p in submitted.iterdir() if (p / assignment).is_dir()) if submitted.is_dir() else []


def deal(students: list[str], jobs: int) -> list[list[str]]:
    """``jobs`` batches (fewer when there are fewer students), as even as dealing cards makes them."""
    return [batch for batch in (students[i::jobs] for i in range(jobs)) if batch]


def make_copy(course: Path, batch: list[str], assignment: str, where: Path) -> Path:
    """A course folder for one batch: what nbgrader reads, and these students' submissions only."""
    where.mkdir(parents=True)
    for name in COPIED:
        source = course / name
        if source.is_dir():
            shutil.copytree(source, where / name)
        elif source.is_file():
            shutil.copy2(source, where / name)
    for student in batch:
        shutil.copytree(course / "submitted" / student, where / "submitted" / student)
    return where


def kernel_sockets(folder: Path) -> list[str]:
    """nbgrader's options that make its kernels talk over Unix sockets named ``folder/kernel-1`` to ``-5``.

    jupyter_client 8 (``connect.py``, ``write_connection_file``) finds a kernel's five TCP ports by binding port 0
    and closing each socket again, and the kernel binds them a moment later: another process starting a kernel
    meanwhile can be handed the same port, and one of the two kernels dies with zmq "Address already in use"
    before it answers. With ``transport = "ipc"`` a "port" is a number after ``KernelManager.ip``, a path, taken
    as the first ``<ip>-N`` that does not exist; each batch gets a folder of its own (and grades one notebook at
    a time), so no two kernels can pick the same socket. The options reach every kernel nbgrader starts: its
    ``Execute`` preprocessor (nbclient) builds its ``KernelManager`` from nbgrader's config. ``folder`` must be
    short: a Unix socket's path holds at most 104 bytes (macOS; 108 on Linux). Without ipc (zmq on Windows),
    no options: the ports stay TCP.
    """
    import zmq

    if not zmq.has("ipc"):
        return []
    return ["--KernelManager.transport=ipc", f"--KernelManager.ip={folder / 'kernel'}"]


def merge_grades(batch_db: Path, course_db: Path, assignment: str, students: list[str]) -> None:
    """Copy these students' submissions (scores, comments, flags, timestamps) from a batch's gradebook into the
    course's, replacing any earlier submission of theirs there."""
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{batch_db}") as batch, \
            Gradebook(f"sqlite:///{course_db}") as gradebook:
        # nbgrader 0.9's gradebook code makes SQLAlchemy 2 warn on every new submission, as nbgrader_config.py says
        warnings.filterwarnings("ignore", category=SAWarning, module=r"nbgrader\.api")
        for student in students:
            graded = batch.find_submission(assignment, student)
            who = graded.student
            gradebook.update_or_create_student(student, first_name=who.first_name, last_name=who.last_name,
                                               email=who.email, lms_user_id=who.lms_user_id)
            try:
                gradebook.remove_submission(assignment, student)
            except MissingEntry:
                pass
            gradebook.add_submission(assignment, student, timestamp=graded.timestamp, extension=graded.extension)
            for notebook in graded.notebooks:
                copy = gradebook.find_submission_notebook(notebook.name, assignment, student)
                copy.flagged, copy.late_submission_penalty = notebook.flagged, notebook.late_submission_penalty
                for grade in notebook.grades:
                    mine = gradebook.find_grade(grade.name, notebook.name, assignment, student)
                    mine.auto_score, mine.manual_score = grade.auto_score, grade.manual_score
                    mine.extra_credit, mine.needs_manual_grade = grade.extra_credit, grade.needs_manual_grade
                for comment in notebook.comments:
                    mine = gradebook.find_comment(comment.name, notebook.name, assignment, student)
                    mine.auto_comment, mine.manual_comment = comment.auto_comment, comment.manual_comment
            gradebook.db.commit()


def autograde(course: Path, assignment: str, jobs: int, nbgrader_args: list[str]) -> int:
    """Grade every submitted student of ``assignment`` in ``course``, ``jobs`` batches at once; the exit status."""
    course = course.resolve()
    students = students_of(course, assignment)
    if not students:
        print(f"no submissions of {assignment!r} in {course / 'submitted'} (submitted/<student>/{assignment}/)",
              file=sys.stderr)
        return 1
    batches = deal(students, jobs)
    work = Path(tempfile.mkdtemp(prefix=f".{course.name}-autograde-", dir=course.parent))
    # the kernels' sockets: a short path in the system's temporary folder (the course's may be too deep for one)
    sockets = Path(tempfile.mkdtemp(prefix="pagedkv-kernels-"))
    try:
        return grade_batches(course, assignment, batches, work, sockets, nbgrader_args)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def grade_batches(course: Path, assignment: str, batches: list[list[str]], work: Path, sockets: Path,
                  nbgrader_args: list[str]) -> int:
    """One nbgrader per batch, all at once, each in its copy of the course under ``work`` and with its kernels'
    sockets in its own folder under ``sockets``; then the batches' grades into the course; the exit status."""
    runs = []
    for k, batch in enumerate(batches):
        copy = make_copy(course, batch, assignment, work / f"batch-{k}")
        (sockets / str(k)).mkdir()
        log = open(copy / "autograde.log", "w")
        runs.append((batch, copy, log, subprocess.Popen(
            [sys.executable, "-m", "nbgrader", "autograde", assignment, *kernel_sockets(sockets / str(k)),
             *nbgrader_args], cwd=copy, stdout=log, stderr=subprocess.STDOUT)))
    print(f"autograding {sum(map(len, batches))} students in {len(batches)} batches at once ...", flush=True)
    failed = []
    for batch, copy, log, process in runs:
        process.wait()
        log.close()
        print(f"--- batch {copy.name}: {', '.join(batch)}\n{(copy / 'autograde.log').read_text()}", flush=True)
        if process.returncode:
            failed.append(copy)
            continue
        for student in batch:
            target = course / "autograded" / student / assignment
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(copy / "autograded" / student / assignment, target)
        merge_grades(copy / "gradebook.db", course / "gradebook.db", assignment, batch)
    if failed:
        print(f"nbgrader failed in {', '.join(map(str, failed))}: those students were not graded (see autograde.log "
              "there); the others were.", file=sys.stderr)
        return 1
    shutil.rmtree(work)
    return 0
