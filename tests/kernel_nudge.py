"""Wake a kernel that has stopped reading its shell socket: ``with nudging(folder, "tmp*.json"): ...``.

Now and then, on this 2-core machine, a kernel run by nbgrader's autograde finishes a widget cell of notebook
08 and then never reads the next request: nbgrader waits, the kernel sits idle, until some other connection
speaks to the kernel, and then both requests are answered (seen three times with ipykernel 6.30.1, nbclient
0.11, pyzmq 27.3; close to ipython/ipykernel#1554). Without help a stall costs the whole cell timeout.
Voila's page stall (test_app_browser.py) is not cured by this: it is handled there by loading again.

``nudging`` sends every running kernel whose connection file is in ``folder`` a harmless
``kernel_info_request`` from a fresh connection, and waits for the answer.
"""

import contextlib
import threading
from pathlib import Path


def nudge(connection_file: Path, timeout: float) -> None:
    """One kernel_info request from a fresh connection; waits for the reply (a reply to a peer that has
    left is itself a way to stall a kernel, ipykernel#1554), so the request is never abandoned early."""
    import zmq
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(connection_file), context=zmq.Context.instance())
    try:
        client.load_connection_file()
        client.start_channels(iopub=False, stdin=False, hb=False, control=False)  # one socket: shell
        client.kernel_info(reply=True, timeout=timeout)
    except Exception:  # noqa: BLE001 - a kernel that was starting, or has shut down
        pass
    finally:
        client.stop_channels()


@contextlib.contextmanager
def nudging(folder: Path, pattern: str, every: float = 5.0, timeout: float = 300.0):
    """Every ``every`` seconds, nudge each kernel that has no nudge in flight (one thread per nudge)."""
    stop, in_flight = threading.Event(), set()

    def nudge_once(connection_file):
        try:
            nudge(connection_file, timeout)
        finally:
            in_flight.discard(connection_file)

    def loop():
        while not stop.wait(every):
            for connection_file in set(Path(folder).glob(pattern)) - in_flight:
                in_flight.add(connection_file)
                threading.Thread(target=nudge_once, args=(connection_file,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()  # a nudge still in flight ends with its reply or its timeout (a daemon thread)
