"""Exercise notebooks generated from the solution notebooks: ``python -m pagedkv labs``.

Convention: in a solution notebook, what students must write sits between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` comment lines (hint comments go
just above).  The generator replaces each region with a stub:

* at the top level, every ``name = ...`` the region assigns becomes
  ``name = ...  # TODO`` (the check cell then says "no answer yet");
* inside a function, the body becomes ``raise NotImplementedError("TODO ...")``
  (the check cell says there is no answer yet);
* ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` regions (the lines that
  switch nbgrader's autograde to grading mode) are removed.

The same markers drive nbgrader (``nbgrader generate_assignment``), whose cell
metadata the solution notebooks carry: see notebooks/README.md.

It also strips every output and execution count, drops saved widget state, and
puts a header cell on top.  Output is deterministic: running it twice writes
the same bytes.  Notebooks are JSON, so no Jupyter library is needed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

REGION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[^\n]*\n(?P<body>.*?)^[ \t]*### END SOLUTION[^\n]*(\n|$)",
                    re.M | re.S)
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*(\n|$)", re.M | re.S)
ASSIGNED = re.compile(r"^(\w+)\s*=(?!=)", re.M)

HEADER = """# Lab version of notebook {number}

This is the **exercise** copy of `{name}`: outputs are cleared and the parts for you to write say
`TODO`. Work top to bottom, one cell at a time:

* Before each code cell, **predict** what it will print (the *Predict* prompts ask you to write it down);
  then run it and compare. Running everything at once would show you the answers before you think.
* In each exercise's answer cell, replace the `...` (or the `raise NotImplementedError`) with your answer,
  then run the **check cell** under it. It prints `[ok]`, or which part is off and a hint, never the
  answer; `check.reveal("<id>")`, with the id the check cell names, shows the answer if you are stuck. A check
  never crashes the notebook.

No GPU is needed: the CUDA kernel runs in numba's CUDA simulator. Please do not publish solutions.
"""


def stub(indent: str, body: str) -> str:
    """What replaces one solution region."""
    if indent:
        return f'{indent}raise NotImplementedError("TODO: write this part")\n'
    names = ASSIGNED.findall(body)
    if not names:
        return 'raise NotImplementedError("TODO: write this part")\n'
    return "".join(f"{name} = ...  # TODO: your answer\n" for name in names)


def strip_solutions(source: str) -> str:
    """Solution regions become stubs; hidden test regions (nbgrader's grading lines) disappear."""
    return HIDDEN.sub("", REGION.sub(lambda m: stub(m.group("indent"), m.group("body")), source))


def fingerprint(cells) -> str:
    """A hash of the cells' sources: it changes as soon as anyone edits the notebook."""
    text = "\x00".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_untouched_lab(path) -> bool:
    """True for a generated lab nobody has edited since (running it is fine): safe to overwrite."""
    try:
        notebook = json.loads(Path(path).read_text(encoding="utf-8"))
        stored = notebook["metadata"]["pagedkv_lab"]["fingerprint"]
        return notebook["cells"][0]["id"] == "lab-header" and stored == fingerprint(notebook["cells"])
    except (ValueError, KeyError, IndexError, TypeError, OSError):
        return False


def make_exercise(notebook: dict, name: str) -> dict:
    """The exercise version of one solution notebook (a new dict; the input is not changed)."""
    cells = [{"cell_type": "markdown", "id": "lab-header", "metadata": {},
              "source": (HEADER.format(number=name.split("_", 1)[0], name=name)).splitlines(keepends=True)}]
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = {"cell_type": cell["cell_type"], "id": cell.get("id", f"cell-{index}"),  # stable ids: no churn
               "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k != "nbgrader"}}
        if cell["cell_type"] == "code":
            new.update(execution_count=None, outputs=[])
            source = strip_solutions(source)
        new["source"] = source.splitlines(keepends=True)  # nbformat's on-disk form: a list of lines
        cells.append(new)
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k != "widgets"}
    metadata["pagedkv_lab"] = {"fingerprint": fingerprint(cells)}  # lets a re-run tell a student's edits apart
    return {"cells": cells, "metadata": metadata, "nbformat": notebook.get("nbformat", 4),
            "nbformat_minor": notebook.get("nbformat_minor", 5)}


def generate_labs(notebooks="notebooks/", out="labs/") -> list[Path]:
    """Write an exercise notebook for every solution notebook in ``notebooks``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        exercise = make_exercise(json.loads(path.read_text(encoding="utf-8")), path.name)
        target = out / path.name
        target.write_text(json.dumps(exercise, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
    return written


READING_HEADER = """# Notebook {number}, as a student reads it

This is the **reading copy** of `{name}`, the one the course table links: every explanation, figure and stored
output is here, and the answers are not. Exercise cells say `TODO`, and the cells that check or reveal a
prediction show no output. The cells that run after a *Predict* prompt keep theirs, so each prediction's answer
is printed just below it: to predict before you look, use the lab copy. To work it, clone the repository and
run `make lab`: the same notebook, runnable, in `labs/`. Instructors find the solutions in `notebooks/`.
"""


def _answer_names(notebook: dict) -> set[str]:
    """Every name a solution region assigns (``p1``, ``e2_grids``, ...): a cell using one shows an answer."""
    names = set()
    for cell in notebook["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for match in REGION.finditer(source):
            if not match.group("indent"):
                names.update(ASSIGNED.findall(match.group("body")))
    return names


def make_reading_copy(notebook: dict, name: str) -> dict:
    """The copy a student reads on GitHub: outputs kept, answers gone (solution regions stubbed; no output under
    a cell that holds an answer, checks one, or prints a prediction's verdict)."""
    answers = _answer_names(notebook)
    uses_answer = re.compile(r"\b(" + "|".join(map(re.escape, sorted(answers))) + r")\b") if answers else None
    cells = [{"cell_type": "markdown", "id": "reading-header", "metadata": {},
              "source": READING_HEADER.format(number=name.split("_", 1)[0], name=name).splitlines(keepends=True)}]
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = {"cell_type": cell["cell_type"], "id": cell.get("id", f"cell-{index}"),
               "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k != "nbgrader"}}
        if cell["cell_type"] == "code":
            shows_answer = bool(REGION.search(source)) or cell.get("metadata", {}).get("nbgrader", {}).get("grade") \
                or (uses_answer is not None and uses_answer.search(REGION.sub("", source)))
            new.update(execution_count=None, outputs=[] if shows_answer else cell.get("outputs", []))
            source = strip_solutions(source)
        new["source"] = source.splitlines(keepends=True)
        cells.append(new)
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k != "widgets"}
    return {"cells": cells, "metadata": metadata, "nbformat": notebook.get("nbformat", 4),
            "nbformat_minor": notebook.get("nbformat_minor", 5)}


def generate_reading_copies(notebooks="notebooks/", out="course/") -> list[Path]:
    """Write the reading copy of every solution notebook to ``out`` (the course table in README.md links them)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        copy = make_reading_copy(json.loads(path.read_text(encoding="utf-8")), path.name)
        target = out / path.name
        target.write_text(json.dumps(copy, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
    return written
