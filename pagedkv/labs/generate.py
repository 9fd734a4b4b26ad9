"""Exercise notebooks generated from the solution notebooks: ``python -m pagedkv labs``.

Convention: in a solution notebook, what students must write sits between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` comment lines (hint comments go
just above).  The generator replaces each region with a stub:

* at the top level, every ``name = ...`` the region assigns becomes
  ``name = ...  # TODO`` (the check cell then says "no answer yet");
* inside a function, the body becomes ``raise NotImplementedError("TODO ...")``
  (the check cell reports it as not written yet).

It also strips every output and execution count, drops saved widget state, and
puts a header cell on top.  Output is deterministic: running it twice writes
the same bytes.  Notebooks are JSON, so no Jupyter library is needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REGION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[^\n]*\n(?P<body>.*?)^[ \t]*### END SOLUTION[^\n]*(\n|$)",
                    re.M | re.S)
ASSIGNED = re.compile(r"^(\w+)\s*=(?!=)", re.M)

HEADER = """# Lab version of notebook {number}

This is the **exercise** copy of `{name}`: outputs are cleared and the parts for you to write say
`TODO`. Work top to bottom (*Run > Run All Cells* once, then cell by cell).

* Before each code cell, **predict** what it will print; then run it and compare.
* In the exercise cells, replace each `...` (or `raise NotImplementedError`) with your answer.
* Run the **check cell** right after: it prints `[ok]` for each right answer, or what it expected,
  what you gave, and a hint. A check never crashes the notebook.

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
    return REGION.sub(lambda m: stub(m.group("indent"), m.group("body")), source)


def make_exercise(notebook: dict, name: str) -> dict:
    """The exercise version of one solution notebook (a new dict; the input is not changed)."""
    cells = [{"cell_type": "markdown", "id": "lab-header", "metadata": {},
              "source": (HEADER.format(number=name.split("_", 1)[0], name=name)).splitlines(keepends=True)}]
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new = {"cell_type": cell["cell_type"], "id": cell.get("id", f"cell-{index}"),  # stable ids: no churn
               "metadata": dict(cell.get("metadata", {}))}
        if cell["cell_type"] == "code":
            new.update(execution_count=None, outputs=[])
            source = strip_solutions(source)
        new["source"] = source.splitlines(keepends=True)  # nbformat's on-disk form: a list of lines
        cells.append(new)
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k != "widgets"}
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
