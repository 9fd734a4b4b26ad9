"""The visualizer in a real JupyterLab, driven by Chromium through Playwright.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with a reason
when it is missing.  The server listens on 127.0.0.1 only, with a random
token, and the server and the browser are shut down even when the test fails.
"""

import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from browser_helpers import CHROMIUM, chromium_page, free_port, stop, wait_for_server

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_block_table_visualizer.ipynb"

pytestmark = pytest.mark.browser


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab serving a copy of notebook 07 from tmp_path; yields (base_url, token)."""
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "PAGEDKV_QUIET": "1"}
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp_path}", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"] + (["--allow-root"] if os.geteuid() == 0 else []),
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_server(f"{base}/api/status?token={token}", server)
        yield base, token
    finally:
        stop(server)
        log.close()


def test_visualizer_reacts_to_clicks(jupyterlab, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    base, token = jupyterlab
    with chromium_page(sync_api, tmp_path, viewport={"width": 1400, "height": 1000},
                       server_log=tmp_path / "jupyterlab.log") as page:
        page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
        page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
        select_kernel = page.locator(".jp-Dialog button:has-text('Select')")
        try:  # JupyterLab may ask which kernel to start; the notebook's own (python3) is preselected
            select_kernel.click(timeout=15_000)
        except sync_api.TimeoutError:
            pass
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
        page.click("li.lm-Menu-item:has-text('Run All Cells')")
        # Every wait waits for the state it asserts: the widget creates its elements before it writes them.
        expect = sync_api.expect
        counters, drawing = page.locator(".pagedkv-counters"), page.locator(".widget-output img").first
        expect(counters).to_contain_text("blocks used 0/24", timeout=120_000)
        expect(drawing).to_have_attribute("src", re.compile(r"^data:image/png"), timeout=60_000)
        empty_pool = drawing.get_attribute("src")

        page.click("button:has-text('add sequence')")
        expect(counters).to_contain_text("blocks used 2/24", timeout=30_000)  # 6 tokens in blocks of 4
        expect(drawing).not_to_have_attribute("src", empty_pool, timeout=30_000)
        one_sequence = drawing.get_attribute("src")

        page.click("button:has-text('append')")
        expect(counters).to_contain_text("internal fragmentation 12%", timeout=30_000)  # 7 tokens in 2 blocks of 4
        expect(drawing).not_to_have_attribute("src", one_sequence, timeout=30_000)
        page.screenshot(path=str(tmp_path / "visualizer.png"), full_page=False)
    assert (tmp_path / "visualizer.png").stat().st_size > 10_000
