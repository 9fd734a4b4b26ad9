"""What the browser tests share: Debian's Chromium, a free port on 127.0.0.1, starting and stopping a server."""

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request

CHROMIUM = os.environ.get("PAGEDKV_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, server: subprocess.Popen, what: str, timeout: float = 90) -> None:
    """Poll ``ready()`` until it succeeds; a server that exits or never gets ready is an error that says so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            ready()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{what} within {timeout} s")


def wait_for_server(url: str, server: subprocess.Popen, timeout: float = 90) -> None:
    """Until ``url`` answers."""
    wait_until(lambda: urllib.request.urlopen(url, timeout=2).close(), server, f"no answer at {url}", timeout)


def stop(server: subprocess.Popen) -> None:
    """Terminate, and kill if it does not go within 15 s."""
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def wait_for_port(port: int, server: subprocess.Popen, timeout: float = 90) -> None:
    """Until 127.0.0.1:port accepts a connection (for servers whose pages are costly to fetch)."""
    wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close(), server,
               f"nothing listened on 127.0.0.1:{port}", timeout)


def offline_args() -> list[str]:
    """Chromium's options that refuse, at once, every request that leaves this machine, without intercepting any:
    all of them go to a proxy on a port where nothing listens, and Chromium never proxies 127.0.0.1 (loopback is
    bypassed by default). Playwright's own interception (``page.route``) holds a beacon that a page sends as it is
    left until the browser closes (tests/test_app_browser.py), so a test of beacons must not use it."""
    return [f"--proxy-server=http://127.0.0.1:{free_port()}"]


@contextlib.contextmanager
def chromium_page(sync_api, tmp_path, viewport, server_log=None, offline=False):
    """A page in Debian's Chromium, always closed; ``offline``: nothing off this machine answers (``offline_args``).

    On failure, what the page said (console, uncaught errors, failed requests) and the tail of ``server_log``
    are printed, so pytest shows them, and a screenshot lands in tmp_path/failure.png.
    """
    said = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + (offline_args() if offline else []))
        page = browser.new_page(viewport=viewport)
        page.on("console", lambda message: said.append(f"console {message.type}: {message.text}"))
        page.on("pageerror", lambda error: said.append(f"page error: {error}"))
        page.on("requestfailed", lambda request: said.append(f"request failed: {request.url} {request.failure}"))
        page.on("crash", lambda _: said.append("the page crashed"))
        try:
            yield page
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))  # look here when it fails
            print("--- what the page said", *said[-60:], sep="\n")
            if server_log is not None and os.path.exists(server_log):
                with open(server_log, encoding="utf-8", errors="replace") as log:
                    print("--- the server's log (tail)", *log.readlines()[-60:], sep="\n")
            raise
        finally:
            browser.close()
