"""Answer checks for the exercises: say what is wrong, never crash, never give the answer away.

Every exercise has an id, a slug such as ``"next-block-after-frees"``.  Its expected answer is not
written in the notebook: ``exercises.py`` computes it by running the package
itself (the allocator, the scheduler, the kernel's own index arithmetic), and
``check.exercise(key, answer)`` compares.  A failed check says what is off
(for an answer of several values given as a tuple, not which of them: they
could be solved one at a time) and gives a hint towards the idea; ``check.reveal(key)`` shows the answer
to a student who asks for it.

Values are compared, not types: a list, a tuple, a numpy array and a torch
tensor holding the same numbers are the same answer (the check says so when
only the type differs).  Where an exercise's answer is a set (values whose order
is not asked), any sequence of those values is right.

Two modes:

* **student mode** (the default): prints ``[ok]`` or ``[not yet]`` and never raises;
* **grading mode**: a wrong or missing answer raises ``CheckFailed`` (an
  ``AssertionError``) with the same message, so ``nbgrader autograde`` gives the
  exercise no points; the feedback shows ``AssertionError: <the message>``.  It
  is on by itself under nbgrader, which sets ``NBGRADER_EXECUTION`` to
  ``autograde`` (or ``validate``) for the kernels it runs; ``check.grading()``
  or ``PAGEDKV_GRADING=1`` switch it on anywhere else.  (The check cells need no
  hidden line, so nbgrader finds them exactly as it released them.)
"""

from __future__ import annotations

import inspect
import math
import os
from enum import Enum
from numbers import Number

from ..errors import PagedKVError, PagedKVKeyError, PagedKVValueError
from .exercises import EXERCISES, label
from .predictions import PREDICTIONS

PASS, FAIL = "[ok]", "[not yet]"
_grading = os.environ.get("PAGEDKV_GRADING") == "1"


def grading(on: bool = True) -> None:
    """Switch grading mode on or off by hand (under nbgrader it is on by itself: see ``grading_now``)."""
    global _grading
    _grading = bool(on)


def grading_now() -> bool:
    """True when a wrong answer must raise: switched on by hand, or the kernel runs under nbgrader."""
    return _grading or os.environ.get("NBGRADER_EXECUTION") in ("autograde", "validate")


def plain(value):
    """The value without its container type: tensors, arrays, tuples become lists; numpy scalars Python numbers."""
    if isinstance(value, (str, bytes, Enum)):
        return value
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _kind(value) -> str:
    return type(value).__name__


def difference(got, expected, tolerance: float = 0.0, where: str = "", sizes: bool = True) -> str | None:
    """What is wrong with ``got``, in words that do not give ``expected`` away; None when they agree. An expected
    set is an answer whose order does not count: any sequence of the same values is right, and a wrong one is only
    "not right", never told its size (how many values there are is half such an answer). ``sizes=False`` keeps the
    size of every part unsaid the same way (the answer's own parts are still counted: that is its format)."""
    if isinstance(expected, (set, frozenset)):
        if not isinstance(got, (list, tuple, set, frozenset)):
            return f"{where or 'the answer'} should be a collection of values (in any order), not a {_kind(got)}"
        try:
            same = set(got) == expected
        except TypeError:  # unhashable members (lists): not the values asked for
            same = False
        return None if same else f"{where or 'the answer'} is not right"
    if isinstance(expected, list):
        if not isinstance(got, list):
            values = "values" if where and not sizes else f"{len(expected)} values"
            return f"{where or 'the answer'} should be a sequence of {values}, not a {_kind(got)}"
        if len(got) != len(expected):
            if where and not sizes:
                return f"{where} is not right"
            return f"{where or 'the answer'} has {len(got)} values, not the number wanted"
        part = "part" if any(isinstance(e, (list, set, frozenset)) for e in expected) else "value"  # ([5, 1], 1)
        for i, (g, e) in enumerate(zip(got, expected)):
            problem = difference(g, e, tolerance, f"{part} {i + 1} of {where}" if where else f"{part} {i + 1}", sizes)
            if problem:
                return problem
        return None
    if isinstance(expected, Number) and not isinstance(expected, bool):
        if not isinstance(got, Number) or isinstance(got, bool):
            return f"{where or 'the answer'} should be a number, not a {_kind(got)}"
        if math.isclose(got, expected, rel_tol=tolerance, abs_tol=0.0 if tolerance else 1e-12):
            return None
        return f"{where or 'the answer'} is not right"  # never "too high/low": five guesses would bisect it
    if got == expected:
        return None
    if isinstance(expected, Enum) and not isinstance(got, Enum):
        return f"{where or 'the answer'} should be one of {type(expected).__name__}'s members, not a {_kind(got)}"
    return f"{where or 'the answer'} is not right"


def type_note(got, expected) -> str:
    """A word when the values agree but the container differs (never a reason to fail)."""
    outer = (type(got), type(expected))
    if outer[0] is outer[1] or not isinstance(expected, (list, tuple)):
        return ""
    return f" (you gave a {_kind(got)} where a {_kind(expected)} was asked: the values are what count)"


class CheckFailed(AssertionError):
    """A wrong answer while grading. IPython (and so nbgrader's feedback) shows just its message, not the frames
    of this module it was raised in."""

    def _render_traceback_(self) -> list[str]:
        return [f"AssertionError: {self}"]


def _fail(message: str, key: str | None, graded: bool = True) -> None:
    if graded and grading_now():
        raise CheckFailed(message)
    print(message + (f" Stuck? check.reveal({key!r}) shows the answer." if key else ""))


def _blank(value) -> bool:
    return value is None or value is Ellipsis


def report(name: str, got, expected, hint: str = "", tolerance: float = 0.0, key: str | None = None,
           mistakes=(), graded: bool = True, sizes: bool = True, say_which: bool = True) -> bool:
    """Compare one answer with the expected value; print (or, grading, raise) the verdict. True when right.

    ``graded=False`` (predictions): the verdict is printed even while grading, never raised. ``sizes=False``: a part
    of the wrong length is only "not right" (see ``difference``). ``say_which=False``: a wrong value of a list answer
    is not located either (its position would narrow the answer down), as a tuple's never is.
    ``mistakes``: ``(wrong_answer, why)`` pairs; an answer equal to a known wrong one is told what went wrong in
    the reasoning that leads there (``why``), which says more than "not right" and gives nothing away."""
    if _blank(got) or (isinstance(got, (list, tuple)) and any(_blank(g) for g in got)):
        _fail(f"{FAIL} {name}: no answer yet - replace the ... with your answer.", None, graded)
        return False
    problem = difference(plain(got), plain(expected), tolerance, sizes=sizes)
    if problem and (isinstance(expected, tuple) or (not say_which and isinstance(expected, list))) \
            and problem.endswith("is not right"):
        # several answers to one question: which of them is right is not said, or they could be solved one by one
        problem = f"at least one of its {len(expected)} values is not right (the check does not say which)"
    why = next((why for wrong, why in mistakes if problem and difference(plain(got), plain(wrong), tolerance)
                is None), None)
    if why:
        _fail(f"{FAIL} {name}: {got!r} is not it yet: {why}", key, graded)
        return False
    if problem:
        _fail(f"{FAIL} {name}: {got!r} is not it yet: {problem}." + (f" Hint: {hint}" if hint else ""), key, graded)
        return False
    print(f"{PASS} {name}: right{type_note(got, expected)}.")
    return True


_FROM_THE_PACKAGE = object()  # no truth passed: the question's own ``expected`` computes it


def prediction(key: str, got, truth=_FROM_THE_PACKAGE) -> None:
    """A "predict, then run" verdict on prediction ``key`` (e.g. ``"free-queue-next-block"``): ``[ok]`` or what is
    off, never the value; ``truth`` is what the run just produced. A question asked before anything runs passes no
    ``truth``: its ``expected`` in ``predictions.py`` computes it; one with a ``from_run`` there is passed the run
    itself, and ``from_run`` works the value out of it (a formula in the cell would give the method away). Its
    title, hint and known slips are there too, not in the cell. Predictions earn no points, so it prints and never
    raises, under nbgrader too (a blank one says "no answer yet")."""
    try:
        question = PREDICTIONS[key]
    except (KeyError, TypeError):
        raise PagedKVKeyError(f"there is no prediction {key!r}; a prediction id is the slug its check cell names, "
                              f"one of: {', '.join(PREDICTIONS)}.") from None
    if truth is _FROM_THE_PACKAGE:
        if question.expected is None:
            raise PagedKVValueError(f"prediction {key!r} is compared with what the run produced: pass that value "
                                    "as the third argument.")
        truth = question.expected()
    elif question.from_run is not None:  # the run itself was passed: the value to compare is worked out of it here
        truth = question.from_run(truth)
    report(question.title, got, truth, hint=question.hint, tolerance=question.tolerance, mistakes=question.mistakes,
           graded=False, sizes=question.sizes)


def function_cases(name: str, student_fn, reference_fn, cases, hint: str = "", key: str | None = None,
                   run=None, tolerance: float = 0.0) -> bool:
    """Run ``student_fn`` and ``reference_fn`` on each case; report the first case that differs. With ``run``, both
    are tuples of functions and a case is ``run(functions, *case)`` (several functions checked together)."""
    for fn in student_fn if run else (student_fn,):
        if not callable(fn):
            _fail(f"{FAIL} {name}: expected a function, got a {_kind(fn)}.", None)
            return False
    call = (lambda fns, args: run(fns, *args)) if run else (lambda fn, args: fn(*args))
    for args in cases:
        shown = ", ".join(repr(a) for a in args)
        try:
            got = call(student_fn, args)
        except NotImplementedError:
            _fail(f"{FAIL} {name}: no answer yet - write the function's body (it raises NotImplementedError).", None)
            return False
        except Exception as error:  # a student's bug: a message, not a traceback
            what = f"{name}, case {shown}," if run else f"{name}({shown})"
            _fail(f"{FAIL} {what} raised {type(error).__name__}: {error}." + (f" Hint: {hint}" if hint else ""),
                  key)
            return False
        problem = difference(plain(got), plain(call(reference_fn, args)), tolerance)
        if problem:
            what = f"{name}, case {shown}: gave" if run else f"{name}({shown}) returned"
            _fail(f"{FAIL} {what} {got!r}: {problem}." + (f" Hint: {hint}" if hint else ""), key)
            return False
    print(f"{PASS} {name}: all {len(cases)} cases right.")
    return True


def _exercise(key: str):
    """The exercise named ``key``, or a message that lists the keys there are."""
    try:
        return EXERCISES[key]
    except (KeyError, TypeError):
        raise PagedKVKeyError(f"there is no exercise {key!r}; an exercise id is the slug its check cell names, "
                              f"one of: {', '.join(EXERCISES)}.") from None


class Checked:
    """A check's verdict: true when the answer is right. The notebook shows only the printed line, no bare
    ``True`` under the cell (IPython calls ``_ipython_display_`` instead of printing a result)."""

    def __init__(self, ok: bool):
        self.ok = ok

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"Checked({self.ok})"

    def _ipython_display_(self) -> None:
        pass


def exercise(key: str, *answers) -> Checked:
    """Check the answer(s) to exercise ``key`` (e.g. ``"next-block-after-frees"``); several answers are checked as
    one tuple. Messages name the exercise as the notebook does ("E1 next block")."""
    ex = _exercise(key)
    title = f"{label(key)} {ex.title}"
    if ex.cases and ex.run:  # several functions: check.exercise(key, f, g), or the tuple (f, g)
        functions = answers[0] if len(answers) == 1 and isinstance(answers[0], tuple) else answers
        if len(functions) != len(ex.reference):
            _fail(f"{FAIL} {title}: expected {len(ex.reference)} functions, got {len(functions)}.", None)
            return Checked(False)
        return Checked(function_cases(title, tuple(functions), ex.reference, ex.cases, ex.hint, key, ex.run,
                                      ex.tolerance))
    if ex.cases:
        return Checked(function_cases(title, answers[0] if answers else None, ex.reference, ex.cases, ex.hint, key))
    answer = answers[0] if len(answers) == 1 else tuple(answers)
    expected, mistakes = ex.expected(), [(wrong(), why) for wrong, why in ex.mistakes]
    blank = _blank(answer) or (isinstance(answer, (list, tuple)) and any(_blank(a) for a in answer))
    if ex.outcome is not None and not blank:  # the answer is a way there: what it gives is compared
        try:
            answer = ex.outcome(answer)
        except PagedKVError as error:
            _fail(f"{FAIL} {title}: {str(error).rstrip('.')}. Hint: {ex.hint}", key)
            return Checked(False)
        expected, mistakes = ex.outcome(expected), [(ex.outcome(wrong), why) for wrong, why in mistakes]
    return Checked(report(title, answer, expected, ex.hint, ex.tolerance, key, mistakes, say_which=ex.say_which))


def reveal(key: str) -> None:
    """Print the answer to exercise ``key``: try first, then ask."""
    ex = _exercise(key)
    if ex.cases:
        solutions = ex.solution if isinstance(ex.solution, tuple) else (ex.solution,)
        print(f"{label(key)} {ex.title}, one way to write it:\n" + "\n".join(map(inspect.getsource, solutions)))
    elif ex.outcome is not None:
        print(f"{label(key)} {ex.title}: {ex.outcome(ex.expected())!r}, for example after {ex.expected()!r}")
    else:
        print(f"{label(key)} {ex.title}: {ex.expected()!r}")
