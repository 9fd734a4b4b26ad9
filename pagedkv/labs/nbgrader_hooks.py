"""What a course's ``nbgrader_config.py`` adds to nbgrader (see ``notebooks/nbgrader_config.py``).

``StubAnswers``: nbgrader's ``ClearSolutions`` puts one fixed ``code_stub`` where each answer was, by default
``raise NotImplementedError()``, so *Run All* on a released notebook stops at the first blank answer and every
check cell after it fails on a name that was never assigned. ``StubAnswers`` writes the stubs ``make labs``
writes instead: an answer region at the top level of a cell becomes ``name = ...  # YOUR CODE HERE`` for each
name it assigns, so the check cell under it says "no answer yet" and *Run All* goes on. A region inside a
function (or one that assigns no name) gets the configured ``ClearSolutions.code_stub``.

``ClearWidgetState``: ``generate_assignment`` clears outputs but keeps the notebook's widget state, which a
notebook may store so a widget shows on GitHub (notebook 07's visualizer once stored 77 models with their replay
logs). Released notebooks do not need it.
"""

import re

from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import ClearSolutions
from traitlets import Bool

from .generate import ASSIGNED

ANSWER = "{name} = ...  # YOUR CODE HERE"


class StubAnswers(ClearSolutions):
    """nbgrader's ``ClearSolutions`` with one ``name = ...`` stub per name a top-level answer assigns."""

    def _replace_solution_region(self, cell, language: str) -> bool:
        if cell.cell_type != "code":
            return super()._replace_solution_region(cell, language)
        lines, new_lines, region, replaced = cell.source.split("\n"), [], None, False
        for line in lines:
            if self.begin_solution_delimeter in line:
                region, indent, replaced = [], re.match(r"\s*", line).group(0), True
            elif self.end_solution_delimeter in line and region is not None:
                new_lines += self._stub(indent, "\n".join(region), language)
                region = None
            elif region is not None:
                region.append(line)
            else:
                new_lines.append(line)
        if region is not None:  # no END SOLUTION: nbgrader's own error message
            return super()._replace_solution_region(cell, language)
        cell.source = "\n".join(new_lines)
        return replaced

    def _stub(self, indent: str, body: str, language: str) -> list[str]:
        names = ASSIGNED.findall(body) if not indent else []
        lines = [ANSWER.format(name=name) for name in names] or self.code_stub[language].split("\n")
        return [indent + line for line in lines]


class ClearWidgetState(Preprocessor):
    """Drop ``metadata.widgets`` from a notebook."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb, resources):
        nb.metadata.pop("widgets", None)
        return nb, resources
