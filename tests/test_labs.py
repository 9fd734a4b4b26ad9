"""The students' exercise notebooks are generated from the solution notebooks, and their checks are friendly."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from pagedkv.errors import PagedKVKeyError, PagedKVValueError
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
    assert [p.name for p in labs] == [p.name for p in SOLUTIONS] and len(labs) == 16
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
    hidden = "x = 1\n### BEGIN HIDDEN TESTS\ncheck.grading()\n### END HIDDEN TESTS\ncheck.exercise('k', x)\n"
    assert strip_solutions(hidden) == "x = 1\ncheck.exercise('k', x)\n"
    assert strip_solutions(body) == 'def f(a):\n    raise NotImplementedError("TODO: write this part")\n'


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name[:2])
def test_solution_notebooks_pass_every_check(solution):
    outputs = "".join(text_of(c) for c in code_cells(solution))
    assert "[ok]" in outputs and "[not yet]" not in outputs


def test_checks_print_and_never_raise(capsys):
    check.report("x", ..., 3)
    check.report("x", 2, 3, "hint here")
    check.report("x", "3", 3)
    check.report("x", 3.0001, 3, tolerance=1e-3)
    check.exercise("lane-work", lambda lane, bs, n: 1 / 0)
    check.exercise("lane-work", lambda lane, bs, n: ([0], [0]))
    check.exercise("lane-work", 42)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[not yet] x: no answer yet")
    assert out[1] == "[not yet] x: 2 is not it yet: the answer is not right. Hint: hint here"
    assert out[2] == "[not yet] x: '3' is not it yet: the answer should be a number, not a str."
    assert out[3].startswith("[ok]")
    assert "raised ZeroDivisionError" in out[4] and "check.reveal('lane-work')" in out[4]
    assert out[5].startswith("[not yet] E1 lane_work(13, 8, 32) returned ([0], [0]): ")
    assert out[6] == "[not yet] E1 lane_work: expected a function, got a int."


@pytest.mark.parametrize("answer", [(560, 1520), [560, 1520], np.array([560, 1520]), torch.tensor([560, 1520]),
                                    (np.int64(560), 1520.0)])
def test_values_are_compared_not_types(answer, capsys):
    assert check.exercise("watermark-longest-prompts", answer)
    out = capsys.readouterr().out
    assert out.startswith("[ok]")
    assert ("the values are what count" in out) == (not isinstance(answer, tuple))


def test_a_failed_check_never_shows_the_answer(capsys):
    from pagedkv.labs.exercises import EXERCISES

    for key, exercise in EXERCISES.items():
        if exercise.cases:
            continue
        expected = exercise.expected()
        wrong = "not an answer" if not isinstance(expected, (int, float)) else expected + 1
        assert not check.exercise(key, wrong)
        out = capsys.readouterr().out
        assert out.startswith("[not yet]") and repr(expected) not in out, key
    assert not check.exercise("watermark-longest-prompts", (560, 1600))
    out = capsys.readouterr().out  # several answers to one question: not which value is off, nor which way
    assert "at least one of its 2 values is not right" in out and "value 2" not in out
    assert not check.exercise("watermark-longest-prompts", [560])
    assert "has 1 values, not the number wanted" in capsys.readouterr().out  # the shape is said
    assert not check.exercise("table-after-a-free", ([4, 1], 1))  # a table and a slot: two parts (issue #38 wording)
    assert "part 1 has 2 values, not the number wanted" in capsys.readouterr().out
    assert not check.exercise("table-after-a-free", ([4, 1, 0], 1))
    out = capsys.readouterr().out
    assert "at least one of its 2 values is not right" in out and "part 1" not in out


def test_a_list_of_block_ids_does_not_say_which_is_wrong(capsys):
    """Review 03-s4r2: E1's check said "value 3 is not right" (its third value), which locates the error and reads
    as block 3; with ``say_which=False`` a wrong list is told only that one of its values is off."""
    assert not check.exercise("next-block-after-frees", [3, 0, 1])
    out = capsys.readouterr().out
    assert "at least one of its 3 values is not right (the check does not say which)" in out and "value 3" not in out
    assert not check.report("x", [1, 2], [1, 3])  # the default still locates a list's wrong value
    assert "value 2 is not right" in capsys.readouterr().out


def test_a_set_answer_takes_any_order_and_keeps_its_size_unsaid(capsys):
    """Review 07-s4r1: E2's cached free blocks were checked in free-queue order, which the prompt never asked for, and
    a wrong list was told its length ("part 2 has 2 values, not the number wanted"), half the answer."""
    for answer in ({2}, set()), ([2], []), ((2,), ()):
        assert check.exercise("visualizer-evicted-names", answer)
    capsys.readouterr()
    assert not check.exercise("visualizer-evicted-names", ({2, 0}, set()))
    out = capsys.readouterr().out
    assert "at least one of its 2 values is not right" in out and "values, not the number" not in out
    assert not check.exercise("visualizer-evicted-names", ([3, 2], []))  # the slip, in any order, is named
    assert "never had a name" in capsys.readouterr().out
    # a prediction whose part's length is half its answer: that length is not said either
    check.prediction("visualizer-free-returns", (4, [2], 1), (4, [3, 2], 1))
    out = capsys.readouterr().out
    assert "at least one of its 3 values is not right" in out and "values, not the number" not in out


def test_an_answer_that_is_a_way_there_is_replayed(capsys):
    """Review 07-s4r4: E1 asks for actions, not a value; the check replays them and compares where they lead, so any
    way there is right, and a wrong one is told where it led (its own run), never the answer."""
    for actions in ([("add_sequence", 17), ("free", "C")], [("append", "A", 18), ("free", "A")],
                    [("add_sequence", 16), ("add_sequence", 1), ("free", "D")]):
        assert check.exercise("visualizer-swap-home", actions), capsys.readouterr().out
    capsys.readouterr()
    assert not check.exercise("visualizer-swap-home", [("add_sequence", 16), ("free", "C")])
    out = capsys.readouterr().out
    assert "[3, 2] is not it yet" in out and "in the other order" in out and "17" not in out
    for bad, said in (([("swap_out", "A")], "no swaps"), ([("add_sequence", 1)] * 4, "at most three"),
                      ([("add_sequence", 100)], "changed nothing"), ([("free", "B")], "after your actions")):
        assert not check.exercise("visualizer-swap-home", bad)
        out = capsys.readouterr().out
        assert out.startswith("[not yet]") and said in out and "17" not in out, out
    assert not check.exercise("visualizer-swap-home", ...)
    assert "no answer yet" in capsys.readouterr().out
    check.reveal("visualizer-swap-home")
    assert "[2, 3], for example after [('add_sequence', 17), ('free', 'C')]" in capsys.readouterr().out


def test_a_known_mistake_is_named_without_the_answer(capsys):
    assert not check.report("x", 4, 3, "hint", mistakes=[(4, "you counted the prompt blocks once per sample.")])
    out = capsys.readouterr().out
    assert out.startswith("[not yet] x: 4 is not it yet: you counted the prompt blocks once per sample.")
    assert "3" not in out.replace("[not yet] x: 4", "")
    assert check.report("x", 3, 3, mistakes=[(3, "never shown for a right answer")])
    assert "never shown" not in capsys.readouterr().out


def test_every_known_mistake_is_wrong_and_named_without_the_answer(capsys):
    """Each exercise's mistakes replay the situation with a wrong rule: the answer they give must fail the check,
    and the check must name the slip without showing the expected answer."""
    from pagedkv.labs.exercises import EXERCISES

    named = 0
    for key, exercise in EXERCISES.items():
        for wrong, why in exercise.mistakes:
            assert not check.exercise(key, wrong()), key
            out = capsys.readouterr().out
            assert why in out and repr(check.plain(exercise.expected())) not in out, key
            named += 1
    assert named >= 12


def test_reveal_shows_the_answer_on_request(capsys):
    check.reveal("returning-prefix-table")
    assert "E2 the new request's blocks: [0, 2]" in capsys.readouterr().out
    check.reveal("lane-work")
    assert "def lane_work" in capsys.readouterr().out


def test_grading_mode_raises_the_same_message(capsys):
    check.grading()
    try:
        with pytest.raises(AssertionError, match="no answer yet"):
            check.exercise("next-block-after-frees", ...)
        with pytest.raises(AssertionError, match=r"E1 the blocks get_new_blocks\(3\) returns"):
            check.exercise("next-block-after-frees", [0, 0, 0])
        with pytest.raises(AssertionError, match="no answer yet - write the function's body"):
            check.exercise("lane-work", lambda *args: exec("raise NotImplementedError"))
        assert check.exercise("next-block-after-frees", [3, 0, 2])
    finally:
        check.grading(False)
    assert capsys.readouterr().out.startswith("[ok] E1 the blocks get_new_blocks(3) returns")


@pytest.mark.parametrize("execution", ["autograde", "validate"])
def test_grading_is_on_by_itself_under_nbgrader(monkeypatch, capsys, execution):
    """nbgrader sets NBGRADER_EXECUTION for the kernels it runs: no hidden line needed to grade."""
    monkeypatch.setenv("NBGRADER_EXECUTION", execution)
    with pytest.raises(AssertionError, match=r"E1 the blocks get_new_blocks\(3\) returns"):
        check.exercise("next-block-after-frees", [0, 0, 0])
    monkeypatch.delenv("NBGRADER_EXECUTION")
    assert not check.exercise("next-block-after-frees", [0, 0, 0])  # a student's notebook: a message, no exception
    assert "[not yet] E1 the blocks get_new_blocks(3) returns" in capsys.readouterr().out


def test_every_exercise_solution_passes_its_own_check(capsys):
    from pagedkv.labs.exercises import EXERCISES

    for key, exercise in EXERCISES.items():
        answer = exercise.solution if exercise.cases else exercise.expected()
        assert check.exercise(key, answer), capsys.readouterr().out


def test_labs_drop_the_hidden_grading_lines(labs):
    for path in labs:
        text = path.read_text()
        assert "HIDDEN TESTS" not in text and "grading()" not in text and "nbgrader" not in text, path.name


def test_the_labs_command_never_overwrites_solutions_or_a_students_work(tmp_path, capsys):
    from pagedkv.__main__ import main

    assert main(["labs", "--notebooks", str(NOTEBOOKS), "--out", str(NOTEBOOKS)]) == 2
    assert "is the solutions folder" in capsys.readouterr().err
    out = tmp_path / "labs"
    assert main(["labs", "--notebooks", str(NOTEBOOKS), "--out", str(out)]) == 0
    assert main(["labs", "--notebooks", str(NOTEBOOKS), "--out", str(out)]) == 0  # untouched labs: regenerated
    lab = out / SOLUTIONS[1].name
    notebook = json.loads(lab.read_text())
    notebook["cells"][-2]["source"] = ["next_block = 3\n"]  # a student's answer
    lab.write_text(json.dumps(notebook))
    capsys.readouterr()
    assert main(["labs", "--notebooks", str(NOTEBOOKS), "--out", str(out)]) == 2
    assert "someone has edited" in capsys.readouterr().err and "next_block = 3" in lab.read_text()
    shutil.copy(SOLUTIONS[0], out / SOLUTIONS[0].name)
    assert main(["labs", "--notebooks", str(NOTEBOOKS), "--out", str(out)]) == 2


@pytest.mark.parametrize("key", ["01.E1", "next-block", None])
def test_an_unknown_exercise_key_lists_the_keys(key):
    for call in (lambda: check.exercise(key, 1), lambda: check.reveal(key)):
        with pytest.raises(KeyError, match=r"no exercise .*: tp-blocks-growth, requests-at-two-block-sizes"):
            call()


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_visualize_refuses_a_port_that_is_not_one(port, capsys):
    from pagedkv.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["visualize", "--port", port, "--no-browser"])
    assert exit_.value.code == 2 and "is not a TCP port: use a number from 1 to 65535" in capsys.readouterr().err


def test_a_failed_check_while_grading_shows_only_its_message():
    """Issue #29: nbgrader's feedback showed a 7-frame traceback through check.py before the message."""
    from pagedkv.labs.check import CheckFailed

    check.grading()
    try:
        with pytest.raises(CheckFailed) as failure:
            check.exercise("next-block-after-frees", [0, 0, 0])
    finally:
        check.grading(False)
    assert failure.value._render_traceback_() == [f"AssertionError: {failure.value}"]
    assert str(failure.value).startswith("[not yet] E1 the blocks get_new_blocks(3) returns")


def test_the_sanitize_file_drops_the_simulator_notice():
    """nbval reads 'regex: ...' and 'replace: ...' pairs; a bare 'replace:' (no space) silently drops a pattern."""
    from nbval.plugin import get_sanitize_patterns

    patterns = dict(get_sanitize_patterns((NOTEBOOKS / "sanitize.cfg").read_text()))
    notice = "pagedkv: no CUDA GPU (no NVIDIA driver found); numba.cuda kernels run in numba's CUDA simulator.\n"
    assert any(re.sub(regex, replace, f"a\n{notice}b\n") == "a\nb\n" for regex, replace in patterns.items())


def test_the_reading_copies_are_current_and_hold_no_answer():
    """README's course table links course/: the solution notebooks with their outputs, less every answer
    (regenerate with ``python -m pagedkv reading``)."""
    import json
    from pathlib import Path

    from pagedkv.labs.generate import make_reading_copy

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        expected = make_reading_copy(json.loads(path.read_text()), path.name)
        stored = json.loads((root / "course" / path.name).read_text())
        assert stored == expected, f"course/{path.name} is stale: run python -m pagedkv reading"
        solution = json.loads(path.read_text())
        text = json.dumps(stored)
        assert "BEGIN SOLUTION" not in text
        graded = {c["id"] for c in solution["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
        assert all(not c.get("outputs") for c in stored["cells"] if c["id"] in graded)
        # figures and text stay: only a cell that holds an answer or checks one loses its output
        for cell, copy in zip(solution["cells"], stored["cells"][1:]):
            source = "".join(cell["source"])
            if cell.get("outputs") and not copy.get("outputs"):
                assert "check." in source or "### BEGIN SOLUTION" in source, (path.name, cell["id"])


def test_the_guide_states_the_course_as_it_is(tmp_path):
    """Issue #46: the guide said "Eleven notebooks", "26 in all" and "30 in all" for 12, 31 and 33, and its lab
    plans described exercises that were not there. Its counts, points and exercise lists are one generated block
    (`python -m pagedkv guide`): the committed one must be what the course generates now, and no count of them is
    written anywhere else in the guide."""
    from pagedkv.labs.guide import BEGIN, END, course_facts, render, rewrite

    guide = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    facts = course_facts(NOTEBOOKS)
    assert render(facts) in guide, "run `python -m pagedkv guide` and commit notebooks/README.md"
    assert len(facts["notebooks"]) == len(SOLUTIONS) and facts["exercises"] == len(check.EXERCISES)
    assert facts["points"] == sum(cell["metadata"]["nbgrader"]["points"] for path in SOLUTIONS
                                  for cell in json.loads(path.read_text())["cells"]
                                  if cell.get("metadata", {}).get("nbgrader", {}).get("grade"))
    outside = guide[:guide.index(BEGIN)] + guide[guide.index(END):]
    numbers = r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|" \
              r"sixteen|seventeen|eighteen|nineteen|twenty)\b"
    stale = re.findall(numbers + r" (notebooks|exercises|points)\b|\b\d+ in all\b", outside, re.IGNORECASE)
    assert not stale, stale
    exercises = {n["file"][:2]: len(n["exercises"]) for n in facts["notebooks"]}
    plans = re.findall(r"^\| \d+ min \| (\d\d) [^|]*\| ([^|]*) \|$", outside, re.MULTILINE)
    assert plans  # the lab plans: each row that lists its notebook's exercises lists them all, and no more
    for number, listed in plans:
        if not listed.startswith("as above"):
            assert len(listed.split("; ")) == exercises[number], (number, listed)
    copy = tmp_path / "README.md"
    copy.write_text(guide.replace(render(facts), f"{BEGIN}\nold text\n{END}"), encoding="utf-8")
    assert rewrite(copy, NOTEBOOKS) and copy.read_text(encoding="utf-8") == guide  # the command writes it back


def _prediction_calls():
    """(notebook stem, key, number of arguments and keywords) for every check.prediction call in the solutions."""
    import ast

    for path in SOLUTIONS:
        for cell in code_cells(path):
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "prediction":
                    arguments = len(node.args) + len(node.keywords)
                    yield path.stem.split("_", 1)[1], ast.literal_eval(node.args[0]), arguments


def test_every_prediction_is_asked_once_in_its_notebook_with_nothing_given_away():
    """A check cell names its prediction by id and passes the guess and the run's value, nothing else: the hint and
    the known wrong answers stay in predictions.py, out of sight until a wrong guess asks for one. A question with
    no run to compare with (its ``expected`` computes the answer) gets the guess alone."""
    from pagedkv.labs.exercises import EXERCISES
    from pagedkv.labs.predictions import PREDICTIONS

    calls = list(_prediction_calls())
    assert sorted(key for _, key, _ in calls) == sorted(PREDICTIONS)  # each asked exactly once, none left unused
    for notebook, key, arguments in calls:
        question = PREDICTIONS[key]
        assert (notebook, arguments) == (question.notebook, 2 if question.expected else 3), key
    assert not set(PREDICTIONS) & set(EXERCISES)


def test_a_question_with_no_run_takes_its_answer_from_the_package(capsys):
    check.prediction("e1-tokens-per-lane", (2, 1))
    check.prediction("e1-tokens-per-lane", (1, 1))  # a known slip: named, the answer not shown
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[ok]") and "how many groups does a warp hold" in out[1] and "(2, 1)" not in out[1]
    with pytest.raises(PagedKVValueError, match="third argument"):
        check.prediction("free-queue-next-block", 3)  # a run's question needs the run's value


def test_a_question_passed_the_run_itself_works_its_value_out_of_it(capsys):
    """A ``from_run`` question gets the run, not the value: the formula stays out of the notebook's check cell."""
    from types import SimpleNamespace as Run

    beam = Run(steps=[Run(blocks_without_sharing=72, num_seqs=4)], peak_without_sharing=72)
    runs = {"parallel": Run(savings=1 - 51 / 72), "beam": beam}
    check.prediction("whole-run-savings", (1 - 51 / 72, 1 - 21 / 72), runs)
    check.prediction("whole-run-savings", (1 - 51 / 72, 1 - 18 / 72), runs)  # a known slip: named
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[ok]") and "distinct beams differ somewhere" in out[1]


def test_an_unknown_prediction_key_lists_the_keys(capsys):
    with pytest.raises(PagedKVKeyError, match="free-queue-next-block"):
        check.prediction("no-such-prediction", 1, 1)
    check.prediction("free-queue-next-block", 3, 0)  # a known slip: named, the run's value not shown
    out = capsys.readouterr().out
    assert "first freed, first reused" in out and " 0" not in out
