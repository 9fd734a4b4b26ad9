# nbgrader's configuration for the pagedkv course: copy this file into your course folder (next to source/).
# nbgrader must run in the environment where `import pagedkv` works (the checkout's .venv after
# `pip install -e '.[test]'`): the check cells import it.
from nbgrader.converters import GenerateAssignment

c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = "pagedkv"
c.Execute.timeout = 120  # seconds per cell (the slowest cell, loading SmolLM2 in notebook 11, takes ~10 s)
# Released notebooks carry no widget state (notebook 08 stores its visualizer's for readers on GitHub).
c.GenerateAssignment.preprocessors = [*GenerateAssignment.class_traits()["preprocessors"].default(),
                                      "pagedkv.labs.nbgrader_hooks.ClearWidgetState"]
