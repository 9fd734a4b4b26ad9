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
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from browser_helpers import CHROMIUM, chromium_page, free_port, stop, wait_for_port

pytestmark = pytest.mark.browser


# Loads in a row, each of which must show the app at once. Before issue #38's fix about one load in 15 here (one in
# four on the reporter's machine) hung for good, so 12 loads catch that with 55-97 % odds for about a minute of CI;
# the fix itself is pinned without a browser (test_viz.py: the widgets set their Output's outputs, never capture).
# PAGEDKV_APP_LOADS=50 runs 50 (done by hand for issue #38).
LOADS = int(os.environ.get("PAGEDKV_APP_LOADS", "12"))


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
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", server=server)
    finally:
        stop(server)
        log.close()


def kernels_of(server) -> int:
    """How many kernel processes the server has running now (from /proc; 0 where there is none)."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == server.pid and "ipykernel" in (stat.parent / "cmdline").read_text():
                count += 1
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            pass
    return count


def only_local(page, url) -> list:
    """The URLs off this machine the page asks for (none should be; chromium_page(offline=True) refuses them at
    once, so the test never waits on DNS and sends nothing outside). Issue #46: Voila's lab template asked a CDN
    for Font Awesome twice per load, which an offline lab room cannot reach; the app's own template
    (pagedkv/viz/jupyter/) asks for nothing. Only listened to, never intercepted: Playwright's interception
    (page.route) holds the beacon a page sends as it is left (see the kernels test below)."""
    outside = []
    page.on("request", lambda request: outside.append(request.url)
            if not request.url.startswith((url, "data:", "blob:", "about:")) else None)
    return outside


def console_errors(page) -> list:
    """The page's console errors and uncaught exceptions, as they come. Issue #46: two came from JupyterLab
    extensions installed beside Voila (nbgrader's and Notebook 7's: "Shared module @jupyterlab/filebrowser
    doesn't exist in shared scope default", "The getter for the shared module is not a function ...
    @jupyterlab/docregistry"), which Voila's page loads and cannot run; Voila's stock lab template logs the same
    two. viz/jupyter/voila.json now leaves them out (extension_denylist). Voila still warns ("Unsatisfied version
    4.2.5 ... of shared singleton module"): its bundled JupyterLab is older than the extensions' builds; those are
    warnings, with either template, and the widgets work."""
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def wait_for_kernels(server, count: int, timeout: float) -> int:
    """Wait until the server has ``count`` kernel processes (at most ``timeout`` s); how many it has then."""
    deadline = time.monotonic() + timeout
    while kernels_of(server) != count and time.monotonic() < deadline:
        time.sleep(0.2)
    return kernels_of(server)


def browser_or_skip():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install chromium)")
    return pytest.importorskip("playwright.sync_api")


def test_the_app_serves_only_on_this_machine(app):
    port = int(app.url.rsplit(":", 1)[1].strip("/"))
    others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    if not others:
        pytest.skip("this machine has no other IPv4 address to try")
    for address in others:  # nobody answers on another interface of this machine
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=1).close()


def test_every_load_shows_the_app_and_leaves_no_kernel_behind(app, tmp_path):
    """Issue #38: now and then a load stayed on "Executing 1 of 4" (or 3 of 4) for good, its kernel idle: the
    widgets drew by capturing into their Output widgets, nbclient answered each captured output on the shell
    socket while it waited there for the cell's reply, and that send swallowed the reply's wake-up (see
    pagedkv/viz/widget_output.py). Every load, in a row and with no second try, must show the app, and log no
    console error. Each page left shuts its kernel down within seconds: Voila's widget manager sends a beacon
    (``navigator.sendBeacon`` to ``voila/api/shutdown/<kernel id>``) from its ``beforeunload`` listener, and
    the server shuts the kernel down (~3 s: a shutdown request, then the process ends).

    Round 5 saw the last kernel alive 60 s after its page was left, once in three CI runs. The cause was this
    test: it refused requests off the machine with Playwright's interception (``page.route("**/*")``), and
    interception holds a beacon sent by a page being left: the route handler never sees it (the page has moved
    on) and Chromium sends it only as the browser closes (measured: with the browser kept open on about:blank,
    the kernel still ran 20 s later, and went 2.7 s after ``browser.close()``; without interception it went
    3 s after the page was left). So every kernel of the 12 loads lived until the browser closed, and a beacon
    still in flight when the browser process ended was lost, its kernel left to the culler. Requests off the
    machine are now refused by Chromium itself (a dead proxy, ``chromium_page(offline=True)``), nothing is
    intercepted, and each beacon must shut its kernel while the browser is still open: the previous load's
    before the next page has drawn (or within 30 s), the last one within 30 s of leaving it. The culler, which
    needs 120 s of idleness, cannot stand in for a beacon within those 30 s."""
    sync_api = browser_or_skip()
    expect = sync_api.expect
    with chromium_page(sync_api, tmp_path, viewport={"width": 1300, "height": 1800},
                       server_log=tmp_path / "voila.log", offline=True) as page:
        outside, errors = only_local(page, app.url), console_errors(page)
        for load in range(1, LOADS + 1):
            page.goto(app.url, wait_until="commit", timeout=60_000)  # leaving the last load shuts its kernel down
            try:
                expect(page.locator(".pagedkv-status")).to_contain_text("running", timeout=60_000)
                expect(page.locator(".pagedkv-counters")).to_contain_text("blocks used 0/24", timeout=30_000)
                expect(page.locator(".widget-output img")).to_have_count(2, timeout=30_000)
            except AssertionError:
                print(f"load {load} of {LOADS} did not show the app:", page.locator("#loading_text").all_inner_texts())
                raise
            assert wait_for_kernels(app.server, 1, timeout=30) == 1, f"load {load}: the last page's kernel still runs"
        page.goto("about:blank")
        assert wait_for_kernels(app.server, 0, timeout=30) == 0, "the last page's beacon did not shut its kernel"
    assert outside == []  # nothing asked of any other machine, on any load
    assert errors == []


def test_the_app_reacts_to_clicks(app, tmp_path):
    sync_api = browser_or_skip()
    with chromium_page(sync_api, tmp_path, viewport={"width": 1300, "height": 1800},
                       server_log=tmp_path / "voila.log", offline=True) as page:
        only_local(page, app.url)
        # Every wait waits for the state it asserts: the widgets create their elements before they write them.
        expect = sync_api.expect
        counters = page.locator(".pagedkv-counters")
        page.goto(app.url, wait_until="commit", timeout=60_000)
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

        reuse = page.locator(".widget-checkbox", has_text="same prompt as the last")
        expect(reuse).to_be_visible()  # issue #38: the label was cut off ("same prompt as the ...")
        assert reuse.evaluate("e => [...e.querySelectorAll('*')].every(c => c.scrollWidth <= c.clientWidth + 1)")
        prompt_len = page.locator(".widget-inline-hbox", has_text="prompt len").locator("input")
        prompt_len.fill("0")
        prompt_len.press("Enter")  # issue #38: 0 became 1 without a word
        page.click("button:text-is('add sequence')")
        expect(page.locator(".pagedkv-message").first).to_contain_text("prompt length must be >= 1", timeout=30_000)
        expect(counters).to_contain_text("blocks used 0/24")
        prompt_len.fill("6")
        prompt_len.press("Enter")
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


# The longest band of blank rows between drawn rows of an <img>, in CSS pixels (the PNG read back from the page).
BLANK_BAND_JS = """img => {
    const canvas = document.createElement('canvas');
    canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
    const context = canvas.getContext('2d');
    context.drawImage(img, 0, 0);
    const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
    let seen = false, run = 0, longest = 0;
    for (let y = 0; y < canvas.height; y++) {
        let blank = true;
        for (let x = 0; x < canvas.width && blank; x++) {
            const i = 4 * (y * canvas.width + x);
            blank = data[i] > 245 && data[i + 1] > 245 && data[i + 2] > 245;
        }
        if (!blank) { if (seen) longest = Math.max(longest, run); seen = true; run = 0; } else if (seen) run++;
    }
    return longest * img.height / img.naturalHeight;
}"""


def test_the_panels_read_at_lab_screen_sizes(app, tmp_path):
    """Issue #46, measured on the rendered page at 1280, 1400 and 1920 px wide and 1000 px high: the scheduler's
    text block map was a ~40 px column at the right edge ("bloc / k_siz / e=4 ..."), and ~250 px of blank
    separated the block map from its key, pushing the key and the log below the fold."""
    sync_api = browser_or_skip()
    expect = sync_api.expect
    with chromium_page(sync_api, tmp_path, viewport={"width": 1280, "height": 1000},
                       server_log=tmp_path / "voila.log", offline=True) as page:
        outside = only_local(page, app.url)
        page.goto(app.url, wait_until="commit", timeout=60_000)
        text_map = page.locator(".pagedkv-map")
        drawings = page.locator(".widget-output img")
        expect(text_map).to_contain_text("free GPU queue", timeout=60_000)
        expect(drawings).to_have_count(2, timeout=30_000)
        expect(drawings.nth(1)).to_have_attribute("src", re.compile(r"^data:image/png"), timeout=30_000)
        block_map, log = drawings.first, page.locator("textarea").first
        for width in (1280, 1400, 1920):  # the page as loaded, scrolled to the top
            page.set_viewport_size({"width": width, "height": 1000})
            assert block_map.evaluate(BLANK_BAND_JS) <= 60, width  # map, then its key: no empty band between
            for what in (block_map, log):  # the key (the map's picture ends with it) and the log: above the fold
                assert what.bounding_box()["y"] + what.bounding_box()["height"] <= 1000, (width, what)
        before = text_map.inner_text()
        page.click("button:text-is('5 steps')")  # a map of some length, as the issue's: blocks used, tables
        expect(text_map).not_to_have_text(before, timeout=30_000)
        expect(text_map).to_contain_text("seq r0", timeout=30_000)
        lines = text_map.inner_text().strip("\n").count("\n") + 1
        line_height = text_map.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
        for width in (1280, 1400, 1920):
            page.set_viewport_size({"width": width, "height": 1000})
            page.screenshot(path=str(tmp_path / f"app-{width}.png"), full_page=True)
            box = text_map.bounding_box()
            assert box["width"] >= 300, (width, box)  # its longest line is ~55 characters
            assert box["height"] <= (lines + 1) * line_height, (width, box, lines)  # no line wrapped
            assert box["x"] + box["width"] <= width, (width, box)  # on screen
        page.goto("about:blank")
    assert outside == []
