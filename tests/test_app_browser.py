"""The standalone visualizer app (``python -m pagedkv visualize``, Voila) in a real Chromium.

The server listens on 127.0.0.1 only and is shut down even when the test fails. Skipped, with the reason,
where Chromium, Playwright or Voila is missing.
"""

import importlib.util
import os
import socket
import subprocess
import sys

import pytest

from browser_helpers import CHROMIUM, chromium_page, free_port, stop, wait_for_port

pytestmark = pytest.mark.browser


@pytest.fixture
def app(tmp_path):
    if importlib.util.find_spec("voila") is None:
        pytest.skip("Voila is not installed: pip install 'pagedkv[viz]'")
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "PAGEDKV_QUIET": "1"}
    log = open(tmp_path / "voila.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "pagedkv", "visualize", f"--port={port}", "--no-browser"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # The app's kernel imports pagedkv (torch, numba): do it once here, so a cold disk cache on a fresh
        # clone is not counted against the page's time to show.
        subprocess.run([sys.executable, "-c", "import pagedkv.viz"], env=env, check=True, timeout=300)
        wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(server)
        log.close()


def open_app(page, url, ready, timeout_error, attempts=4):
    """Load the app until ``ready`` shows; every load starts a fresh kernel.

    Now and then Voila's server never sees the end of the execution although the kernel finished it (the page
    keeps saying "voila is still executing"; about one load in four on a 2-core machine, with ipykernel 6.30,
    close to voila-dashboards/voila#1446 and ipython/ipykernel#1554). A stalled load never recovers, so it is
    loaded again (a healthy load takes 10-15 s here, after the fixture's warm-up). Four stalls fail."""
    for attempt in range(1, attempts + 1):
        page.goto(url, wait_until="commit", timeout=60_000)
        try:
            ready.wait_for(timeout=60_000)
            return
        except timeout_error:
            if attempt == attempts:
                raise
            print(f"load {attempt}: the app did not show within 60 s; loading it again")


def test_the_app_serves_only_on_this_machine(app):
    port = int(app.rsplit(":", 1)[1].strip("/"))
    others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    if not others:
        pytest.skip("this machine has no other IPv4 address to try")
    for address in others:  # nobody answers on another interface of this machine
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=1).close()


def test_the_app_reacts_to_clicks(app, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with chromium_page(sync_api, tmp_path, viewport={"width": 1300, "height": 1800},
                       server_log=tmp_path / "voila.log") as page:
        # Voila's page template asks a CDN for a font stylesheet: refuse anything off this machine at once,
        # so the test never waits on DNS and sends nothing outside.
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(app) else route.abort())
        counters = page.locator(".pagedkv-counters")
        open_app(page, app, counters, sync_api.TimeoutError)
        drawing = page.locator(".widget-output img").first
        drawing.wait_for(timeout=60_000)
        assert "blocks used 0/24" in counters.inner_text()
        assert page.locator("button:text-is('append')").is_disabled()  # nothing to append to yet
        assert "import" not in page.locator("body").inner_text()  # an app: no code cells on screen

        def click_and_wait(label, expect=None):
            before_text, before_img = counters.inner_text(), drawing.get_attribute("src")
            page.click(f"button:text-is('{label}')")
            page.wait_for_function(f"() => document.querySelector('.widget-output img')?.src !== "
                                   f"{before_img!r}", timeout=30_000)
            if expect:
                page.wait_for_function(f"() => document.querySelector('.pagedkv-counters').textContent"
                                       f".includes({expect!r})", timeout=30_000)
            return before_text

        click_and_wait("add sequence", "blocks used 2/24")  # 6 tokens in blocks of 4
        click_and_wait("fork", "blocks used 2/24")  # the child shares both blocks
        click_and_wait("append", "blocks used 3/24")  # copy-on-write of the shared, partly filled block
        click_and_wait("swap out", "blocks used 2/24")  # the child's 2 blocks go to the CPU (1 still shared)
        click_and_wait("beam step")
        log = page.locator("textarea").first.input_value()
        assert all(word in log for word in ("add A", "fork A -> B", "append 1 to B", "swap out B",
                                            "beam search step"))
        status = page.locator(".pagedkv-status")
        before, before_img = status.inner_text(), page.locator(".widget-output img").nth(1).get_attribute("src")
        page.click("button:text-is('step')")  # the scheduler's own widget, below the block tables
        page.wait_for_function(f"() => document.querySelector('.pagedkv-status').textContent !== {before!r}",
                               timeout=30_000)
        page.wait_for_function(f"() => document.querySelectorAll('.widget-output img')[1]?.src !== "
                               f"{before_img!r}", timeout=30_000)
        assert "step 0: prefill r0" in page.locator("body").inner_text()
        page.screenshot(path=str(tmp_path / "app.png"), full_page=True)
    assert (tmp_path / "app.png").stat().st_size > 10_000
