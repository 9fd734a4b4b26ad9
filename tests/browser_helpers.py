"""What the browser tests share: Debian's Chromium, a free port on 127.0.0.1, starting and stopping a server."""

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


def wait_for_server(url: str, server: subprocess.Popen, timeout: float = 90) -> None:
    """Until ``url`` answers; a server that exits or never answers is an error that says so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the server did not answer at {url} within {timeout} s")


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")
