"""The course runs in the real nbgrader, as the instructor guide says (notebooks/README.md): `make release`,
`make autograde` and `make feedback`, from a fresh clone, with nothing of the venv on PATH.

``make release`` releases the solution notebooks; ``make autograde`` then grades three submissions: the released
notebooks untouched (0 points), the solutions (full marks) and the solutions with one plausible wrong answer per
notebook (some points, not all); ``make feedback`` writes the wrong one's feedback and the grades.  The three
autogrades run in parallel, each in its own copy of the course folder (nbgrader's gradebook is one SQLite file).
(Their kernels were once nudged from outside: now and then a widget cell's reply never reached nbgrader. The
widgets caused that, and no longer do: pagedkv/viz/widget_output.py.)
"""

import json
import os
import shutil
import subprocess
import sys
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
    "01": ("(16 * 2 * 80 * (8 // 4) * 128 * 2)", "(16 * 2 * 80 * 8 * 128 * 2)"),  # forgot tensor parallelism
    "02": ("e2_never = 1 - (513 + 1024) / 2 / 1024", "e2_never = (1024 - 513) / 1024"),  # the worst case
    "03": ("next_block = 4", "next_block = 0"),  # vLLM v0's last-freed-first order
    "04": ("e3_cached = 4", "e3_cached = 0"),  # LRU evicts the prompt's first block
    "05": ("e1_copies = [(1, 2)]", "e1_copies = [(1, 2), (1, 3)]"),  # a copy for the fresh block too
    "06": ("e2 = (1, 5)", "e2 = (3, 5)"),  # pruning frees every block of the beam
    "07": ("e1 = (7, 4)", "e1 = (19, 5)"),  # copied a block nobody else holds any more
    "08": ("groups_per_warp = 32 // group_size", "groups_per_warp = group_size"),
    "09": ('e1_victim = "q2"', 'e1_victim = "q4"'),  # the oldest instead of the newest
    "10": ("e1_step = 9", "e1_step = 8"),  # forgot that A's last chunk comes before B's turn
    "11": ("e2 = ([0, 1, 2, 3, 7], 24 + 114)", "e2 = ([1, 1, 1, 4], 24 + 114)"),  # rows per sequence, not their sum
    "12": ("e2_peak_blocks = 6", "e2_peak_blocks = 7"),  # the last sampled token's K/V is never written
    "13": ("e1 = (248, 65)", "e1 = (249, 64)"),  # nulled the block that holds the window's first position
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
        process = subprocess.Popen(command, cwd=clone, env=env, text=True, stdout=log, stderr=subprocess.STDOUT)
    process.log = Path(log.name)
    return process


def finish(process, what):
    process.wait(timeout=900)
    assert process.returncode == 0, f"make {what} failed:\n{process.log.read_text()[-4000:]}"
    # nbgrader goes on with its defaults when the config file fails: that must fail here
    assert "Exception while loading config" not in process.log.read_text(), process.log.read_text()[:2000]


def graded_cells(path):
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def make_wrong(source: Path, target: Path):
    """The solution notebook with one answer cell changed as WRONG says."""
    old, new = WRONG[source.name[:2]]
    notebook = json.loads(source.read_text())
    answers = [c for c in notebook["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    hits = [c for c in answers if old in "".join(c["source"])]
    assert len(hits) == 1, f"{source.name}: the answer to break is not in exactly one answer cell: {old}"
    hits[0]["source"] = "".join(hits[0]["source"]).replace(old, new)
    target.write_text(json.dumps(notebook))


def scores(course: Path, student: str) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission(ASSIGNMENT, student)
        return {nb.name[:2]: (nb.score, nb.max_score) for nb in submission.notebooks}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Release the course, autograde blank, right and wrong submissions (in three course copies), and write the
    wrong one's feedback."""
    root = tmp_path_factory.mktemp("grading")
    clone = fresh_clone(root / "pagedkv")
    course = root / "course"
    finish(make(clone, "release", course), "release")

    runs = {}
    for student in ("blank", "right", "wrong"):
        copy = root / student
        shutil.copytree(course, copy)
        submitted = copy / "submitted" / student / ASSIGNMENT
        submitted.mkdir(parents=True)
        for path in SOLUTIONS:
            if student == "blank":
                shutil.copy(copy / "release" / ASSIGNMENT / path.name, submitted / path.name)
            elif student == "right":
                shutil.copy(path, submitted / path.name)
            else:
                make_wrong(path, submitted / path.name)
        runs[student] = (copy, make(clone, "autograde", copy))
    for student, (_, process) in runs.items():
        finish(process, f"autograde {student}")
    finish(make(clone, "feedback", root / "wrong"), "feedback")
    logs = {student: process.log.read_text() for student, (_, process) in runs.items()}
    return course, {student: scores(copy, student) for student, (copy, _) in runs.items()}, logs


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
    course, _, _ = graded
    for path in sorted((course / "release" / ASSIGNMENT).glob("*.ipynb")):
        text = path.read_text()
        assert "BEGIN SOLUTION" not in text and "grading()" not in text, path.name
        assert "YOUR CODE HERE" in text and '"outputs": []' in text, path.name
        cells = json.loads(text)["cells"]
        assert not any(c.get("outputs") for c in cells), path.name  # no stored output shows a value
        assert "widgets" not in json.loads(text)["metadata"], path.name  # nor widget state (08 stores some)


def test_blank_submission_scores_zero(graded):
    _, by_student, _ = graded
    assert len(by_student["blank"]) == len(SOLUTIONS)
    assert all(score == 0 and maximum > 0 for score, maximum in by_student["blank"].values())


def test_solutions_score_full_marks(graded):
    _, by_student, _ = graded
    assert all(score == maximum for score, maximum in by_student["right"].values()), by_student["right"]


def test_one_wrong_answer_costs_points_in_every_notebook(graded):
    _, by_student, _ = graded
    assert set(by_student["wrong"]) == set(WRONG)
    for number, (score, maximum) in by_student["wrong"].items():
        assert 0 < score < maximum, (number, score, maximum)


def test_autograde_logs_no_warning(graded):
    """An untouched or answered submission is graded without nbgrader warning about its cells: no changed
    checksums (nbgrader#1961 made every hidden-test cell warn) and no outputs it cannot convert to a score."""
    _, _, logs = graded
    for student, log in logs.items():
        assert "Attribute 'checksum'" not in log and "has changed" not in log, (student, log[-3000:])
        assert "cannot be converted" not in log, (student, log[-3000:])
        assert "SAWarning" not in log, (student, log[-3000:])  # nbgrader's own, silenced by nbgrader_config.py


def outputs_text(cell) -> str:
    return json.dumps(cell.get("outputs", []))


def test_blank_checks_say_no_answer_yet_and_nothing_else_fails(graded):
    """Issue #38: nbgrader's default stub (raise NotImplementedError) stopped each notebook at its first blank
    answer; the released answer cells are `name = ...` stubs, so every check runs and says "no answer yet"."""
    course, _, _ = graded
    graded_notebooks = sorted((course.parent / "blank" / "autograded" / "blank" / ASSIGNMENT).glob("*.ipynb"))
    assert len(graded_notebooks) == len(SOLUTIONS)
    for path in graded_notebooks:
        cells = json.loads(path.read_text())["cells"]
        checks = [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
        for cell in checks:
            assert "no answer yet" in outputs_text(cell), (path.name, outputs_text(cell)[:500])
        others = [c for c in cells if c["cell_type"] == "code" and c not in checks]
        assert not any('"output_type": "error"' in outputs_text(c) for c in others), path.name


def test_released_answer_cells_are_the_labs_stubs(graded):
    course, _, _ = graded
    for path in sorted((course / "release" / ASSIGNMENT).glob("*.ipynb")):
        answers = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                   if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
        assert answers and all("= ...  # YOUR CODE HERE" in a or 'raise NotImplementedError("YOUR CODE HERE")' in a
                               for a in answers), path.name
        assert not any("raise NotImplementedError()" in a for a in answers), path.name


def test_run_all_on_a_released_blank_notebook_goes_through(graded):
    """A student's Run All on a released notebook (no nbgrader, so checks print): no cell fails, every check
    says there is no answer yet. Notebook 08: two exercises whose answers are a function's body."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    course, _, _ = graded
    path = next((course / "release" / ASSIGNMENT).glob("08_*.ipynb"))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()  # raises if any cell fails
    checks = [c for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert len(checks) == 2
    for cell in checks:
        assert "[not yet]" in outputs_text(cell) and "no answer yet" in outputs_text(cell), outputs_text(cell)


def test_feedback_and_grades_are_written(graded):
    course, by_student, _ = graded
    wrong = course.parent / "wrong"
    feedback = sorted((wrong / "feedback" / "wrong" / ASSIGNMENT).glob("*.html"))
    assert [p.stem for p in feedback] == [p.stem for p in SOLUTIONS]
    assert "is not it yet" in feedback[1].read_text()  # notebook 02's wrong answer, in the student's words
    grades = (wrong / "grades.csv").read_text().splitlines()
    score = sum(s for s, _ in by_student["wrong"].values())
    assert any(line.startswith(f"{ASSIGNMENT},") and ",wrong," in line and str(score) in line for line in grades)
