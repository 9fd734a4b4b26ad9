"""The standalone visualizer app (``python -m pagedkv visualize``, Voila) in a real Chromium.

The server listens on 127.0.0.1 only and is shut down even when the test fails. Skipped, with the reason,
where Chromium, Playwright or Voila is missing.
"""

import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest

from browser_helpers import CHROMIUM, chromium_page, free_port, stop, wait_for_port

pytestmark = pytest.mark.browser


@pytest.fixture
def app(tmp_path):
    if importlib.util.find_spec("voila") is None:
        pytest.skip("Voila is not installed: pip install -e '.[viz]'")
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
        # Every wait waits for the state it asserts: the widgets create their elements before they write them.
        expect = sync_api.expect
        counters = page.locator(".pagedkv-counters")
        open_app(page, app, counters, sync_api.TimeoutError)
        drawing, log = page.locator(".widget-output img").first, page.locator("textarea").first
        expect(counters).to_contain_text("blocks used 0/24", timeout=60_000)
        expect(drawing).to_have_attribute("src", re.compile(r"^data:image/png"), timeout=60_000)
        expect(page.locator("button:text-is('append')")).to_be_disabled()  # nothing to append to yet
        expect(page.locator("body")).not_to_contain_text("import")  # an app: no code cells on screen

        def click_and_wait(label, news, counts=None):
            before_img = drawing.get_attribute("src")
            page.click(f"button:text-is('{label}')")
            expect(log).to_have_value(re.compile(re.escape(news)), timeout=30_000)
            if counts:
                expect(counters).to_contain_text(counts, timeout=30_000)
            expect(drawing).not_to_have_attribute("src", before_img, timeout=30_000)

        click_and_wait("add sequence", "add A", "blocks used 2/24")  # 6 tokens in blocks of 4
        click_and_wait("fork", "fork A -> B", "blocks used 2/24")  # the child shares both blocks
        click_and_wait("append", "append 1 to B", "blocks used 3/24")  # copy-on-write of the shared partial block
        click_and_wait("swap out", "swap out B", "blocks used 2/24")  # B's 2 blocks go to the CPU (1 still shared)
        click_and_wait("beam step", "beam search step")

        status, schedule = page.locator(".pagedkv-status"), page.locator(".widget-output img").nth(1)
        expect(schedule).to_have_attribute("src", re.compile(r"^data:image/png"), timeout=30_000)
        before_img, before_status = schedule.get_attribute("src"), status.inner_text()  # written before the image
        page.click("button:text-is('step')")  # the scheduler's own widget, below the block tables
        expect(page.locator("body")).to_contain_text("step 0: prefill r0", timeout=30_000)
        expect(status).not_to_have_text(before_status, timeout=30_000)
        expect(schedule).not_to_have_attribute("src", before_img, timeout=30_000)
        page.screenshot(path=str(tmp_path / "app.png"), full_page=True)
    assert (tmp_path / "app.png").stat().st_size > 10_000
