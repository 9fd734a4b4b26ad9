# nbgrader's configuration for the pagedkv course: copy this file into your course folder (next to source/),
# or let `make release` do it (its first step, `make grading`, makes the folder: this file and source/pagedkv/). nbgrader must run in the environment where `import pagedkv` works (the checkout's
# .venv: `make release`, `make autograde` and `make feedback` run it there); the check cells import it.
import warnings

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import ClearSolutions
from sqlalchemy.exc import SAWarning

# nbgrader 0.9's gradebook code makes SQLAlchemy 2 warn ("Object of type <SubmittedNotebook> not in session, add
# operation along 'Notebook.submissions' will not proceed") on every autograde; the grades are right, the log noisy.
warnings.filterwarnings("ignore", category=SAWarning, module=r"nbgrader\.api")

c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = "pagedkv"
# Seconds per cell. The slowest cell (loading SmolLM2, notebook 12) takes ~10 s on a quiet 2-core machine; one
# busy with other work (load average 12-20) graded 13 times slower, so 120 s was too short (notebooks/README.md).
c.Execute.timeout = 300
# Released answer cells say `name = ...  # YOUR CODE HERE` (what `make labs` writes), so Run All gets through a
# half-finished notebook and every blank check says "no answer yet"; an answer inside a function raises this:
c.ClearSolutions.code_stub = {"python": 'raise NotImplementedError("YOUR CODE HERE")'}
hooks = "pagedkv.labs.nbgrader_hooks."
c.GenerateAssignment.preprocessors = [
    hooks + "StubAnswers" if step is ClearSolutions else step
    for step in GenerateAssignment.class_traits()["preprocessors"].default()
] + [hooks + "ClearWidgetState"]  # released notebooks carry no widget state (notebook 07 once stored its visualizer's)
