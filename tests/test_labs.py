"""The students' exercise notebooks are generated from the solution notebooks, and their checks are friendly."""

import json
from pathlib import Path

import pytest

from pagedkv.labs import check
from pagedkv.labs.generate import generate_labs, strip_solutions

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOLUTIONS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def text_of(cell):
    return "".join("".join(o.get("text", "")) for o in cell["outputs"] if o["output_type"] == "stream")


@pytest.fixture(scope="module")
def labs(tmp_path_factory):
    return generate_labs(NOTEBOOKS, tmp_path_factory.mktemp("labs"))


def test_every_notebook_gets_a_lab_without_outputs_and_with_todos(labs):
    assert [p.name for p in labs] == [p.name for p in SOLUTIONS] and len(labs) == 10
    for path in labs:
        text = path.read_text()
        assert "TODO" in text and "BEGIN SOLUTION" not in text, path.name
        assert all(c["outputs"] == [] and c["execution_count"] is None for c in code_cells(path))
        notebook = json.loads(text)
        assert "widgets" not in notebook["metadata"]
        assert notebook["cells"][0]["source"][0].startswith("# Lab version of notebook")
        ids = [c["id"] for c in notebook["cells"]]
        assert len(ids) == len(set(ids))  # nbformat 4.5 wants unique cell ids


def test_generation_is_idempotent(labs, tmp_path):
    again = generate_labs(NOTEBOOKS, tmp_path)
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(labs, again))


def test_stubs():
    source = "# Hint: think\n### BEGIN SOLUTION\nx = 1\ny = [2]\n### END SOLUTION\nprint(x)\n"
    todo = "...  # TODO: your answer\n"
    assert strip_solutions(source) == f"# Hint: think\nx = {todo}y = {todo}print(x)\n"
    body = "def f(a):\n    ### BEGIN SOLUTION\n    return a\n    ### END SOLUTION\n"
    assert strip_solutions(body) == 'def f(a):\n    raise NotImplementedError("TODO: write this part")\n'


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name[:2])
def test_solution_notebooks_pass_every_check(solution):
    outputs = "".join(text_of(c) for c in code_cells(solution))
    assert "[ok]" in outputs and "[not yet]" not in outputs


@pytest.mark.parametrize("index", range(len(SOLUTIONS)), ids=lambda i: SOLUTIONS[i].name[:2])
def test_lab_checks_fail_kindly_on_the_stubs(labs, index):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    notebook = nbformat.read(labs[index], as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises if any cell crashes
    outputs = "".join(text_of(c) for c in notebook.cells if c.cell_type == "code")
    assert "[not yet]" in outputs and "[ok]" not in outputs


def test_checks_print_and_never_raise(capsys):
    check.report("x", ..., 3)
    check.report("x", 2, 3, "hint here")
    check.report("x", "3", 3)
    check.report("x", 3.0001, 3, tolerance=1e-3)
    check.slot_mapping(lambda table, bs, n: 1 / 0)
    check.slot_mapping(lambda table, bs, n: [0] * n)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[not yet] x: no answer yet")
    assert out[1] == "[not yet] x: expected 3, got 2. Hint: hint here"
    assert out[2].startswith("[not yet] x: expected 3, got '3'")
    assert out[3].startswith("[ok]")
    assert "raised ZeroDivisionError" in out[4]
    assert out[5] == "[not yet] slot_mapping([0], 4, 3): expected [0, 1, 2], got [0, 0, 0]."
