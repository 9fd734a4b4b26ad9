"""A figure shown in an ``ipywidgets.Output`` by setting the widget's outputs, never by capturing into it.

Why not ``with output: plt.show()``: while a cell runs under nbclient (which Voilà's app and ``nbgrader
autograde`` run notebooks with), every output captured into an Output widget makes nbclient send the widget's
new state back to the kernel, a ``comm_msg`` on the shell socket (``nbclient/output_widget.py``,
``OutputWidget.sync_state``), while it waits on that same socket for the cell's ``execute_reply``. pyzmq sends
it at once, without the event loop, and that send takes the socket's edge-triggered wake-up with it; the wait is
a ``socket.poll()`` (jupyter_client's ``ZMQSocketChannel.get_msg``), which pyzmq wakes again after such a send
only for pending ``recv``s, not polls. When the reply has already arrived by then, it sits unread: Voilà's page
stays on "Executing 1 of 4" (or 3 of 4) with the kernel idle, and nbgrader's cell runs into its timeout
("Timeout waiting for execute reply"). Setting ``Output.outputs`` is a plain state update from the kernel, to
which nbclient sends nothing back.
"""

from __future__ import annotations

import base64
import io

import matplotlib.pyplot as plt


def show_figure(output, fig) -> None:
    """Make ``output`` show ``fig`` as a PNG, replacing what it showed (one update: no blank flash between
    drawings), and close ``fig`` (so the notebook does not show it a second time under the cell)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    png = base64.b64encode(buffer.getvalue()).decode("ascii")
    output.outputs = ({"output_type": "display_data", "metadata": {},
                       "data": {"image/png": png, "text/plain": repr(fig)}},)
