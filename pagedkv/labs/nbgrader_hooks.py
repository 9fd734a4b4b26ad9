"""What a course's ``nbgrader_config.py`` adds to nbgrader (see ``notebooks/nbgrader_config.py``).

``ClearWidgetState``: ``generate_assignment`` clears outputs but keeps the notebook's widget state, which
notebook 08 stores so its visualizer shows on GitHub (77 widget models with their replay logs). Released
notebooks do not need it.
"""

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool


class ClearWidgetState(Preprocessor):
    """Drop ``metadata.widgets`` from a notebook."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb, resources):
        nb.metadata.pop("widgets", None)
        return nb, resources
