"""Autograde a class several students at a time: ``make autograde JOBS=N`` (``python -m pagedkv autograde``).

nbgrader grades one student after another in one process, and its gradebook is one SQLite file, which two
nbgrader processes must not write at once. So the students are dealt into ``jobs`` batches; each batch is
graded by its own ``nbgrader autograde`` in its own copy of the course folder (the config, the gradebook,
``source/`` and ``release/``, and only that batch's ``submitted/`` folders), all batches at once; then each
batch's ``autograded/<student>/`` folders are moved into the course and its grades copied into the course's
gradebook (nbgrader's own API), one batch after another. ``make feedback`` then works as after a plain
``make autograde``. A batch that fails leaves the course as it was for its students, and its copy (with
nbgrader's log) is kept and named.
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
    runs = []
    for k, batch in enumerate(batches):
        copy = make_copy(course, batch, assignment, work / f"batch-{k}")
        log = open(copy / "autograde.log", "w")
        runs.append((batch, copy, log, subprocess.Popen(
            [sys.executable, "-m", "nbgrader", "autograde", assignment, *nbgrader_args], cwd=copy,
            stdout=log, stderr=subprocess.STDOUT)))
    print(f"autograding {len(students)} students in {len(batches)} batches at once ...", flush=True)
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
