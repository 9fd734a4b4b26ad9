"""``TracePlayer``: a recorded run played in a notebook, by the same ``player.js`` the HTML pages use.

An anywidget (ES-module widget: JupyterLab, Notebook 7 and VS Code run it with no extension to install); its
``trace`` is the trace's JSON object, its ``step`` the step shown, synced both ways (``player.step = 5`` moves the
page; the buttons and the slider move ``player.step``); ``follow(recorder)`` shows a run as it is recorded.
Needs the ``lab`` extra (``pip install anywidget``).
"""

from __future__ import annotations

from ..errors import PagedKVValueError
from .trace import PLAYER_JS, Trace, load_trace

try:
    import anywidget
    import traitlets
except ImportError:  # pragma: no cover - the lab extra installs it
    anywidget = None


if anywidget is not None:
    class TracePlayer(anywidget.AnyWidget):
        """``TracePlayer(trace)``: a ``Trace``, its JSON text, a path, or a recorder's ``trace()``."""

        _esm = PLAYER_JS
        trace = traitlets.Dict().tag(sync=True)
        step = traitlets.Int(0).tag(sync=True)

        def __init__(self, trace=None, step: int = 0, **kwargs):
            data = {} if trace is None else load_trace(trace).data
            super().__init__(trace=data, step=step, **kwargs)

        def play(self, trace) -> None:
            """Show another trace, from its first step."""
            data = load_trace(trace).data
            with self.hold_sync():  # one message: the page never draws the new trace at the old step
                self.trace, self.step = data, 0

        def follow(self, recorder) -> None:
            """Show a :class:`TraceRecorder`'s steps so far, at the last one: call it after each step a cell runs
            (an engine's, a scheduler's, a hand-made call on a cache) to watch the run live."""
            data = recorder.trace().data
            with self.hold_sync():
                self.trace, self.step = data, len(data["steps"]) - 1

        def __len__(self) -> int:
            return len(self.trace.get("steps", ()))
else:
    class TracePlayer:  # pragma: no cover
        def __init__(self, *args, **kwargs):
            raise PagedKVValueError("TracePlayer needs anywidget: pip install anywidget (or the lab extra: "
                                    "pip install -e '.[lab]').")


__all__ = ["TracePlayer", "Trace"]
