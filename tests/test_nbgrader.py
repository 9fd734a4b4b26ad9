"""The course runs in the real nbgrader, as an instructor would run it (notebooks/README.md).

``nbgrader generate_assignment`` releases the solution notebooks; ``nbgrader autograde`` then grades three
submissions: the released notebooks untouched (0 points), the solutions (full marks) and the solutions with
one plausible wrong answer per notebook (some points, not all).  The three autogrades run in parallel, each in
its own copy of the course folder (nbgrader's gradebook is one SQLite file).
Their kernels are nudged while they run (kernel_nudge.py): now and then a kernel stops reading its shell
socket after a widget cell, and a stall would otherwise cost the whole cell timeout.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_nudge import nudging

pytest.importorskip("nbgrader")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOLUTIONS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
ASSIGNMENT = "pagedkv"
CONFIG = (NOTEBOOKS / "nbgrader_config.py").read_text()  # the file the instructor guide says to copy

# One plausible mistake per notebook: (the solution line, the wrong line).
WRONG = {
    "01": ("(16 * 2 * 80 * (8 // 4) * 128 * 2)", "(16 * 2 * 80 * 8 * 128 * 2)"),  # forgot tensor parallelism
    "02": ("next_block = 4", "next_block = 0"),  # vLLM v0's last-freed-first order
    "03": ("e1_copies = [(1, 2)]", "e1_copies = [(1, 2), (1, 3)]"),  # a copy for the fresh block too
    "04": ("e2 = (1, 5)", "e2 = (3, 5)"),  # pruning frees every block of the beam
    "05": ("e3_cached = 4", "e3_cached = 0"),  # LRU evicts the prompt's first block
    "06": ("e2_never = 1 - (513 + 1024) / 2 / 1024", "e2_never = (1024 - 513) / 1024"),  # the worst case
    "07": ("groups_per_warp = 32 // group_size", "groups_per_warp = group_size"),
    "08": ("e2 = (7, 4)", "e2 = (7, 7)"),  # forgot that forks share the partly filled block too
    "09": ('e1_victim = "q2"', 'e1_victim = "q4"'),  # the oldest instead of the newest
    "10": ("e2_peak_blocks = 6", "e2_peak_blocks = 7"),  # the last sampled token's K/V is never written
    "11": ("e1_step = 9", "e1_step = 8"),  # forgot that A's last chunk comes before B's turn
}


def nbgrader(course: Path, *args, kernels: Path | None = None):
    """Run one nbgrader command in ``course``; its tools (alembic) come from this interpreter's environment.

    ``kernels``: the folder where its kernels' connection files go (jupyter_client writes them to TMPDIR).
    """
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PAGEDKV_QUIET="1", OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")  # three at once on few cores
    if kernels:
        env["TMPDIR"] = str(kernels)
    with open(course / f"nbgrader-{args[0]}.log", "w") as log:  # a file, not a pipe: three never block on it
        process = subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, text=True,
                                   stdout=log, stderr=subprocess.STDOUT)
    process.log = Path(log.name)
    return process


def finish(process, what):
    process.wait(timeout=900)
    assert process.returncode == 0, f"nbgrader {what} failed:\n{process.log.read_text()[-4000:]}"
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
    """Release the course, then autograde blank, right and wrong submissions (in three course copies)."""
    root = tmp_path_factory.mktemp("course")
    course = root / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG)
    for path in SOLUTIONS:
        shutil.copy(path, course / "source" / ASSIGNMENT / path.name)
    finish(nbgrader(course, "generate_assignment", ASSIGNMENT), "generate_assignment")

    runs, kernels = {}, root / "kernels"  # the autogrades' kernel connection files (their TMPDIR)
    kernels.mkdir()
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
        runs[student] = (copy, nbgrader(copy, "autograde", ASSIGNMENT, "--student", student, kernels=kernels))
    with nudging(kernels, "tmp*.json"):
        for student, (_, process) in runs.items():
            finish(process, f"autograde {student}")
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
