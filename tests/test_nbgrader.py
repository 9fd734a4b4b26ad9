"""The course runs in the real nbgrader, as the instructor guide says (notebooks/README.md): `make release`,
`make autograde` and `make feedback`, from a fresh clone, with nothing of the venv on PATH.

``make release`` releases the solution notebooks; ``make autograde JOBS=2`` then grades two students at once (each
in its own copy of the course folder, the grades merged into the course's gradebook: the guide's parallel path):
the released notebooks untouched (0 points in every check) and the solutions with one plausible wrong answer per
notebook, which must lose exactly that exercise's points and score every other check in full, so a right answer
scores full marks in every exercise but the one broken per notebook (those are right in the solution notebooks,
which nbval runs, and in tests/test_labs.py). Each student added one cell to notebook 01, which prints where its
kernel listens: the two batches' kernels share no port (they once raced for one in CI). ``make feedback`` writes
both students' feedback and the grades.
Two autogrades where there were three (a blank, a right and a wrong submission): a third of this test's time.
(Their kernels were once nudged from outside: now and then a widget cell's reply never reached nbgrader. The
widgets caused that, and no longer do: pagedkv/viz/widget_output.py.)
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("nbgrader")
pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("git") is None,
                                reason="make and git are needed (the guide's commands, on a clone)")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
ASSIGNMENT = "pagedkv"
VENV = Path(sys.prefix)  # the environment these tests run in: make's VENV, already installed

# One plausible mistake per notebook: (the solution line, the wrong line).
WRONG = {
    "01": ("weight_bytes / tp", "weight_bytes / 4"),  # split the KV heads over 8 GPUs, not the weights
    "02": ("sum(blocks_needed(100 + produced, 16) * 16 for", "sum((100 + produced) for"),  # paging's tokens, not blocks
    "03": ("next_blocks = [3, 0, 2]", "next_blocks = [0, 3, 2]"),  # one call's list put back block by block
    "04": ("e3_cached = 4", "e3_cached = 0"),  # LRU evicts the prompt's first block
    "05": ("e3 = ([8, 4, 4], 7, 0, 5)", "e3 = ([8, 0, 0], 5, 0, 5)"),  # let the later children hit the whole prompt
    "06": ("e1 = (8, 2, 46)", "e1 = (8, 2, 24)"),  # one token a beam a step, as if the loop forked
    "07": ('e1 = [("add_sequence", 17)', 'e1 = [("add_sequence", 16)'),  # C misses block 3: B comes back [3, 2]
    "08": ("groups_per_warp = 32 // group_size", "groups_per_warp = group_size"),
    "09": ("e1_num_preempted = 3", "e1_num_preempted = 2"),  # let the tail skip the step instead of preempting itself
    "10": ("e1_step = 9", "e1_step = 8"),  # forgot that A's last chunk comes before B's turn
    "11": ("e2 = ([0, 1, 2, 3, 7], 24 + 114)", "e2 = ([1, 1, 1, 4], 24 + 114)"),  # rows per sequence, not their sum
    "12": ("e2 = (8, 3, 40, 0)", "e2 = (8, 3, 40, 34)"),  # padded the mixed step's requests as a decode graph's
    "13": ("e1 = ((1, 2, 3), 16)", "e1 = ((1, 2), 12)"),  # kept only the default's names (interval 0)
    "14": ("e1 = (3, 29, 1)", "e1 = (2, 29, 1)"),  # gave the drafts' block back at the rollback
    "15": ("e1 = (8, 12, 1)", "e1 = (8, 8, 4)"),  # capped the CPU tier's hit at num_tokens - 1
    "16": ("e1 = (33, 3, 32, 2)", "e1 = (32, 2, 32, 2)"),  # forgot the step scheduled before the EOS came back
}


def fresh_clone(target: Path) -> Path:
    """What `git clone` of this checkout gives, with its uncommitted changes: every file git tracks or would add."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a file deleted but not yet staged is listed too
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


def make(clone: Path, target: str, course: Path, *args: str):
    """``make <target> COURSE=<course>`` in the clone, as the guide writes it, in this environment's venv.

    PATH holds nothing of the venv (the guide never activates it). ``-o``: the grade install is there already.
    """
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != (VENV / "bin").resolve())
    env = dict(os.environ, PATH=path, PAGEDKV_QUIET="1", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    command = ["make", "-o", str(VENV / ".pagedkv-grade"), f"VENV={VENV}", f"COURSE={course}", target, *args]
    with open(course.parent / f"make-{target}-{course.name}.log", "w") as log:  # a file: three never block on it
        process = subprocess.Popen(command, cwd=clone, env=env, text=True, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own process group: finish() can end it all
    process.log = Path(log.name)
    return process


def finish(process, what):
    try:
        process.wait(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # make, nbgrader and what they started: nothing left running
        process.wait()
        raise
    assert process.returncode == 0, f"make {what} failed:\n{process.log.read_text()[-4000:]}"
    # nbgrader goes on with its defaults when the config file fails: that must fail here
    assert "Exception while loading config" not in process.log.read_text(), process.log.read_text()[:2000]


def graded_cells(path):
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def make_wrong(source: Path, target: Path) -> str:
    """The solution notebook with one answer cell changed as WRONG says; returns its check cell's grade id."""
    old, new = WRONG[source.name[:2]]
    notebook = json.loads(source.read_text())
    answers = [c for c in notebook["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    hits = [c for c in answers if old in "".join(c["source"])]
    assert len(hits) == 1, f"{source.name}: the answer to break is not in exactly one answer cell: {old}"
    hits[0]["source"] = "".join(hits[0]["source"]).replace(old, new)
    target.write_text(json.dumps(notebook))
    return hits[0]["metadata"]["nbgrader"]["grade_id"].removesuffix("-answer") + "-check"


# A cell a student might add: where its kernel's connection file says the kernel listens.
TRANSPORT_CELL = ("import json, ipykernel.connect\n"
                  "info = json.load(open(ipykernel.connect.get_connection_file()))\n"
                  "print('kernel transport', info['transport'], info['ip'])")


def add_transport_cell(path: Path) -> None:
    notebook = json.loads(path.read_text())
    notebook["cells"].append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                              "source": TRANSPORT_CELL})
    path.write_text(json.dumps(notebook))


def scores(course: Path, student: str) -> dict:
    """``{notebook number: {check's grade id: (score, max_score)}}`` from the course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission(ASSIGNMENT, student)
        return {nb.name[:2]: {g.name: (g.score, g.max_score) for g in nb.grades} for nb in submission.notebooks}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Release the course, autograde a blank and a wrong submission (two at once, `make autograde JOBS=2`; each
    with a cell added to notebook 01 that prints its kernel's transport), and write the feedback. Returns the
    course, each student's scores, the autograde log and the broken checks."""
    root = tmp_path_factory.mktemp("grading")
    clone = fresh_clone(root / "pagedkv")
    course = root / "course"
    finish(make(clone, "release", course), "release")

    broken = {}
    for student in ("blank", "wrong"):
        submitted = course / "submitted" / student / ASSIGNMENT
        submitted.mkdir(parents=True)
        for path in SOLUTIONS:
            if student == "blank":
                shutil.copy(course / "release" / ASSIGNMENT / path.name, submitted / path.name)
            else:
                broken[path.name[:2]] = make_wrong(path, submitted / path.name)
        add_transport_cell(submitted / SOLUTIONS[0].name)
    started = time.monotonic()
    run = make(clone, "autograde", course, "JOBS=2")
    finish(run, "autograde JOBS=2")
    print(f"make autograde JOBS=2, two students: {time.monotonic() - started:.0f} s, load average "
          f"{os.getloadavg()[0]:.1f}")  # pytest -s shows it: the guide's figure
    finish(make(clone, "feedback", course), "feedback")
    assert not list(root.glob(".course-autograde-*"))  # the batches' copies are gone
    return course, {student: scores(course, student) for student in ("blank", "wrong")}, run.log.read_text(), broken


def test_make_autograde_jobs_reaches_pagedkv_and_nothing_else_reaches_nbgrader(monkeypatch):
    """``make autograde JOBS=3`` once gave ``--jobs 3`` after the assignment, where pagedkv's command line passes
    everything on to nbgrader: 2 batches (the default) and nbgrader's "WARNING Unrecognized alias: 'jobs'"."""
    import shlex

    from pagedkv.__main__ import main
    from pagedkv.labs import autograde

    printed = subprocess.run(["make", "-n", "-o", str(VENV / ".pagedkv-grade"), f"VENV={VENV}", "COURSE=course",
                              "autograde", "JOBS=3"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(line for line in printed.splitlines() if "-m pagedkv autograde" in line)
    words = shlex.split(line.split("&&", 1)[1])
    called = []
    monkeypatch.setattr(autograde, "autograde", lambda *args: called.append(args) or 0)
    assert main(words[words.index("pagedkv") + 1:]) == 0
    assert [args[1:] for args in called] == [(ASSIGNMENT, 3, [])]


def test_every_notebook_has_two_graded_exercises():
    for path in SOLUTIONS:
        assert len(graded_cells(path)) >= 2, path.name
        for cell in graded_cells(path):
            meta = cell["metadata"]["nbgrader"]
            source = "".join(cell["source"])
            # no hidden lines: nbgrader switches grading on by itself (NBGRADER_EXECUTION), and a released check
            # cell is the source cell, so autograde finds every checksum as it stored it
            assert meta["locked"] and meta["points"] >= 1 and "HIDDEN" not in source and "grading()" not in source


def test_released_notebooks_hold_no_answers(graded):
    course = graded[0]
    for path in sorted((course / "release" / ASSIGNMENT).glob("*.ipynb")):
        text = path.read_text()
        assert "BEGIN SOLUTION" not in text and "grading()" not in text, path.name
        assert "YOUR CODE HERE" in text and '"outputs": []' in text, path.name
        cells = json.loads(text)["cells"]
        assert not any(c.get("outputs") for c in cells), path.name  # no stored output shows a value
        assert "widgets" not in json.loads(text)["metadata"], path.name  # nor widget state (08 stores some)


def test_blank_submission_scores_zero(graded):
    by_student = graded[1]
    assert len(by_student["blank"]) == len(SOLUTIONS)
    checks = [grade for notebook in by_student["blank"].values() for grade in notebook.values()]
    assert checks and all(score == 0 and maximum > 0 for score, maximum in checks)


def test_one_wrong_answer_costs_exactly_its_points_and_right_ones_score_full_marks(graded):
    _, by_student, _, broken = graded
    assert set(by_student["wrong"]) == set(WRONG) == set(broken)
    for number, checks in by_student["wrong"].items():
        assert broken[number] in checks, (number, broken[number], checks)
        for name, (score, maximum) in checks.items():
            assert score == (0 if name == broken[number] else maximum) and maximum > 0, (number, name, score)


def test_parallel_kernels_share_no_port(graded):
    """`make autograde JOBS=2` once failed in CI: two nbgraders' kernels were handed the same TCP port (zmq
    "Address already in use"; jupyter_client frees a port it picked before the kernel binds it). Each batch's
    kernels now listen on Unix sockets in a folder of their own (pagedkv/labs/autograde.py, kernel_sockets): read
    back from inside the kernels, through the cell each student added to notebook 01."""
    course = graded[0]
    where = {}
    for student in ("blank", "wrong"):
        path = course / "autograded" / student / ASSIGNMENT / SOLUTIONS[0].name
        cell = next(c for c in json.loads(path.read_text())["cells"] if "".join(c["source"]) == TRANSPORT_CELL)
        said = "".join(text for output in cell["outputs"] for text in output.get("text", []))
        match = re.fullmatch(r"kernel transport (\w+) (\S+)\n", said)
        assert match and match[1] == "ipc", (student, cell["outputs"])
        where[student] = Path(match[2]).parent
    assert where["blank"] != where["wrong"], where  # one folder of sockets per batch


def test_autograde_logs_no_warning(graded):
    """An untouched or answered submission is graded without nbgrader warning about its cells: no changed
    checksums (nbgrader#1961 made every hidden-test cell warn) and no outputs it cannot convert to a score."""
    log = graded[2]
    assert "Attribute 'checksum'" not in log and "has changed" not in log, log[-3000:]
    assert "cannot be converted" not in log, log[-3000:]
    assert "SAWarning" not in log, log[-3000:]  # nbgrader's own, silenced by nbgrader_config.py
    assert "WARNING" not in log, log[-3000:]  # e.g. "Unrecognized alias: 'jobs'" (the test above)


def outputs_text(cell) -> str:
    return json.dumps(cell.get("outputs", []))


def test_blank_checks_say_no_answer_yet_and_nothing_else_fails(graded):
    """Issue #38: nbgrader's default stub (raise NotImplementedError) stopped each notebook at its first blank
    answer; the released answer cells are `name = ...` stubs, so every check runs and says "no answer yet"."""
    course = graded[0]
    graded_notebooks = sorted((course / "autograded" / "blank" / ASSIGNMENT).glob("*.ipynb"))
    assert len(graded_notebooks) == len(SOLUTIONS)
    for path in graded_notebooks:
        cells = json.loads(path.read_text())["cells"]
        checks = [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
        for cell in checks:
            assert "no answer yet" in outputs_text(cell), (path.name, outputs_text(cell)[:500])
        others = [c for c in cells if c["cell_type"] == "code" and c not in checks]
        assert not any('"output_type": "error"' in outputs_text(c) for c in others), path.name


def test_released_answer_cells_are_the_labs_stubs(graded):
    course = graded[0]
    for path in sorted((course / "release" / ASSIGNMENT).glob("*.ipynb")):
        answers = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                   if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
        assert answers and all("= ...  # YOUR CODE HERE" in a or 'raise NotImplementedError("YOUR CODE HERE")' in a
                               for a in answers), path.name
        assert not any("raise NotImplementedError()" in a for a in answers), path.name


def test_the_labs_are_the_released_notebooks(graded, tmp_path):
    """What ``make lab`` gives a student (pagedkv's labs) is, cell for cell, what nbgrader released and graded
    blank above: the same code but for the words of each stub. So the blank autograde, whose every check says
    "no answer yet" and whose other cells never fail (the test above), is also the run of every lab; CI runs each
    notebook once less for it (tests/test_labs.py ran every lab top to bottom as well)."""
    from pagedkv.labs.generate import generate_labs

    course = graded[0]
    stub_words = [("# TODO: your answer", "# YOUR CODE HERE"),
                  ('raise NotImplementedError("TODO: write this part")', 'raise NotImplementedError("YOUR CODE HERE")')]
    for lab in generate_labs(NOTEBOOKS, tmp_path):
        released = json.loads((course / "release" / ASSIGNMENT / lab.name).read_text())
        code = ["".join(c["source"]).rstrip("\n") for c in released["cells"] if c["cell_type"] == "code"]
        lab_code = ["".join(c["source"]).rstrip("\n") for c in json.loads(lab.read_text())["cells"]
                    if c["cell_type"] == "code"]  # nbgrader's stubs drop a cell's last newline
        for ours, theirs in stub_words:
            lab_code = [source.replace(ours, theirs) for source in lab_code]
        assert lab_code == code, lab.name


def test_run_all_on_a_released_blank_notebook_goes_through(graded):
    """A student's Run All on a released notebook (no nbgrader, so checks print): no cell fails, every check
    says there is no answer yet. Notebook 08: three exercises whose answers are a function's body."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    course = graded[0]
    path = next((course / "release" / ASSIGNMENT).glob("08_*.ipynb"))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()  # raises if any cell fails
    checks = [c for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert len(checks) == 3
    for cell in checks:
        assert "[not yet]" in outputs_text(cell) and "no answer yet" in outputs_text(cell), outputs_text(cell)


def test_feedback_and_grades_are_written(graded):
    course, by_student, _, _ = graded
    feedback = sorted((course / "feedback" / "wrong" / ASSIGNMENT).glob("*.html"))
    assert [p.stem for p in feedback] == [p.stem for p in SOLUTIONS]
    assert "is not it yet" in feedback[1].read_text()  # notebook 02's wrong answer, in the student's words
    grades = (course / "grades.csv").read_text().splitlines()
    for student in ("blank", "wrong"):
        score = sum(s for checks in by_student[student].values() for s, _ in checks.values())
        assert any(line.startswith(f"{ASSIGNMENT},") and f",{student}," in line and str(score) in line
                   for line in grades), (student, score, grades)
