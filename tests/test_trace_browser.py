"""The trace player (pagedkv/viz/player.js) and the course site in a real Chromium.

One browser for the module. Pages are opened from disk (file://) or from a server on 127.0.0.1 that is always
shut down; every request that would leave the machine is refused and counted as a failure. Skipped, with the
reason, where Chromium or Playwright is missing.
"""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv import BlockSpaceManager, PagedKVCache
from pagedkv.scheduler import Scheduler
from pagedkv.state import render_state
from pagedkv.v1 import KVCacheManager
from pagedkv.v1 import Scheduler as V1Scheduler
from pagedkv.viz.runs import get_run, v1_engine_with_requests
from pagedkv.viz.scheduler_widget import hybrid_groups
from pagedkv.viz.site import build_site
from pagedkv.viz.trace import PLAYER_JS, TraceRecorder, player_page, record_engine, record_scheduler

from browser_helpers import CHROMIUM, CHROMIUM_ARGS, free_port, stop, wait_for_server

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]

# Per step, what the page shows: the text map, each free cell's #n, each table row's entries.
READ_STEP = """el => ({
  step: Number(el.dataset.step),
  text: el.querySelector('.pkv-text').textContent,
  free: Object.fromEntries([...el.querySelectorAll('rect[data-device="gpu"][data-free]')]
        .map(r => [r.dataset.block, Number(r.dataset.free)])),
  tables: [...el.querySelectorAll('.pkv-table')].map(g => [g.dataset.seq, g.dataset.entries]),
  unnamed: [...el.querySelectorAll('rect.pkv-unnamed[data-block]')].map(r => Number(r.dataset.block)),
  error: el.querySelector('.pkv-error') ? el.querySelector('.pkv-error').textContent : null,
})"""


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@contextlib.contextmanager
def page_in(browser, tmp_path, allowed=("file://", "data:")):
    """A fresh page; anything it asks for outside ``allowed`` is refused. Yields (page, problems): problems are
    console errors, uncaught exceptions, failed or refused requests; on failure they are printed with a
    screenshot in tmp_path."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def route(r):
        if r.request.url.startswith(allowed):
            return r.continue_()
        problems.append(f"request leaving the machine: {r.request.url}")
        return r.abort()

    page.route("**/*", route)
    try:
        yield page, problems
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"))
        print("--- what the page said", *problems[-40:], sep="\n")
        raise
    finally:
        context.close()


class Watched:
    """Keeps every snapshot the recorder takes: the Python text maps the page must show."""

    def __init__(self, target):
        self.take, self.texts, self.states = target.snapshot, [], []

    def snapshot(self):
        state = self.take()
        self.states.append(state)
        self.texts.append(render_state(state))
        return state


def engine_run():
    engine = v1_engine_with_requests()
    watched = Watched(engine)
    engine.snapshot = watched.snapshot  # what record_engine's recorder calls each step
    return record_engine(engine, "engine"), watched


def hybrid_run():
    manager = KVCacheManager(4, 12, kv_cache_groups=hybrid_groups(4, 8), max_num_batched_tokens=8)
    watched = Watched(manager)
    arrivals = {0: [("x", list(range(13)), 9), ("y", list(range(40, 45)), 6)]}
    return record_scheduler(V1Scheduler(manager, 4, 8), watched, arrivals=arrivals), watched


def swap_run():
    manager = BlockSpaceManager(block_size=4, num_gpu_blocks=6, num_cpu_blocks=6, watermark=0.0)
    watched = Watched(manager)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=64, preemption_mode="swap")
    return record_scheduler(scheduler, watched, arrivals={0: [("a", list(range(6)), 10), ("b", [7] * 5, 10)]}), watched


def cache_run():
    cache = PagedKVCache(num_gpu_blocks=6, block_size=4, num_kv_heads=1, head_size=1, enable_prefix_caching=True)
    watched = Watched(cache)
    recorder = TraceRecorder(watched, "cache")
    kv = lambda n: __import__("torch").zeros(n, 1, 1)  # noqa: E731
    for label, action in [("A", lambda: cache.add_sequence("A", kv(9), kv(9), token_ids=list(range(9)))),
                          ("fork", lambda: cache.fork("A", "B")),
                          ("cow", lambda: cache.append("B", kv(1), kv(1), token_id=[5])),
                          ("free A", lambda: cache.free("A")),
                          ("C hits", lambda: cache.add_sequence("C", kv(6), kv(6), token_ids=list(range(6))))]:
        action()
        recorder.record(label)
    return recorder.trace(), watched


@pytest.mark.parametrize("make", [engine_run, hybrid_run, swap_run, cache_run],
                         ids=["v1 engine", "hybrid v1 scheduler", "v0 scheduler swapping", "hand-driven cache"])
def test_the_player_shows_python_s_map_at_every_step(browser, tmp_path, make):
    trace, watched = make()
    assert len(watched.texts) == len(trace) >= 5
    page_file = tmp_path / "run.html"
    page_file.write_text(player_page(trace), encoding="utf-8")
    with page_in(browser, tmp_path) as (page, problems):
        page.goto(page_file.as_uri())
        player = page.locator(".pkv-player")

        def check(step, shown=None):
            shown = shown or player.evaluate(READ_STEP)
            state = watched.states[step]
            assert shown["error"] is None, shown["error"]
            assert shown["step"] == step
            assert shown["text"] == watched.texts[step], f"step {step}"
            assert shown["free"] == {str(b): i for i, b in enumerate(state.free_block_ids("gpu"))}, f"step {step}"
            rows = [[str(s), ",".join(map(str, t))] for s, ts in
                    (state.group_tables or {s: (t,) for s, t in state.tables.items()}).items() for t in ts]
            assert shown["tables"] == rows, f"step {step}"
            hatched = state.sliding_blocks(named=False) if state.prefix_caching else set()  # as block_map.py
            assert sorted(shown["unnamed"]) == sorted(hatched), f"step {step}"
            unnamed_seen.update(hatched)

        unnamed_seen = set()
        check(0)
        page.click(".pkv-forward")  # a real click, then the rest clicked in the page (one round trip, not 200)
        check(1)
        shown = player.evaluate(f"""el => {{ const read = {READ_STEP}, seen = [];
            while (!el.querySelector('.pkv-forward').disabled) {{
              el.querySelector('.pkv-forward').click(); seen.push(read(el)); }}
            return seen; }}""")
        assert len(shown) == len(trace) - 2
        for step, seen in enumerate(shown, start=2):
            check(step, seen)
        page.locator(".pkv-root").focus()
        for step in range(len(trace) - 2, max(-1, len(trace) - 5), -1):  # and back, with the arrow key
            page.keyboard.press("ArrowLeft")
            check(step)
        middle = len(trace) // 2
        page.locator(".pkv-slider").evaluate(f"s => {{ s.value = '{middle}'; s.dispatchEvent(new Event('input')); }}")
        check(middle)
        assert not problems
    if trace.data["group_names"]:
        assert unnamed_seen, "the hybrid run should hatch some unnamed sliding blocks"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The course site, built once for the module, served from 127.0.0.1 (shut down at the end)."""
    out = tmp_path_factory.mktemp("site")
    pages = build_site(ROOT / "course", out)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}/"
        wait_for_server(base, server)
        yield base, out, pages
    finally:
        stop(server)


def test_the_site_loads_with_no_request_leaving_the_machine(browser, tmp_path, site):
    base, out, pages = site
    assert pages[0].name == "index.html" and len(pages) == 1 + len(list((ROOT / "course").glob("[0-9]*.ipynb")))
    players = 0
    with page_in(browser, tmp_path, allowed=(base, "data:")) as (page, problems):
        for path in pages:
            page.goto(base + path.name)
            page.wait_for_load_state("load")
            assert page.locator(".pkv-error").count() == 0, path.name
            players += page.locator(".pkv-player .pkv-root").count()
            assert page.locator(".pkv-player").count() == page.locator(".pkv-player .pkv-root").count(), path.name
        assert not problems
    assert players >= 6  # free list, fork, beam search, prefix hits, preemption, hybrid, engine
    index = (out / "index.html").read_text()
    assert index.index("01_") < index.index("02_") < index.index("12_")  # course order
    with page_in(browser, tmp_path) as (page, problems):  # and opened from disk: the last page with a player
        last = next(p for p in reversed(pages) if 'class="pkv-player' in p.read_text())
        page.goto((out / last.name).as_uri())
        assert page.locator(".pkv-player .pkv-root").count() == 1
        page.click(".pkv-forward")
        assert not problems


def test_the_site_keeps_the_answers_out(site):
    _, out, pages = site
    course = {p.stem: p.read_text() for p in (ROOT / "course").glob("[0-9]*.ipynb")}
    for path in pages[1:]:
        assert "### BEGIN SOLUTION" not in path.read_text() and path.stem in course


BROKEN = {
    "empty.json": ("", "empty"),
    "blank.json": ("  \n", "empty"),
    "not-json.json": ("{'steps': [", "not JSON"),
    "other.json": ('{"format": "something-else"}', "not a pagedkv trace"),
    "version.json": ('{"format": "pagedkv-trace", "version": 7}', "version 7"),
}


def broken_delta() -> str:
    data = json.loads(get_run("free-list").record().to_json())
    data["steps"][3]["blocks"] = {"999": [1, [0], 4, -1]}
    return json.dumps(data)


def broken_event() -> str:
    data = json.loads(get_run("free-list").record().to_json())
    data["steps"][0]["event"] = {"scheduled": [5]}
    return json.dumps(data)


def test_empty_and_malformed_files_are_refused_in_the_page(browser, tmp_path):
    files = {name: text for name, (text, _) in BROKEN.items()} | {"bad-block.json": broken_delta(),
                                                                   "bad-event.json": broken_event()}
    says = {name: word for name, (_, word) in BROKEN.items()} | {"bad-block.json": "no block 999",
                                                                 "bad-event.json": "step 0 cannot be drawn"}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    page_file = tmp_path / "page.html"
    page_file.write_text(player_page(get_run("fork").record()), encoding="utf-8")
    empty_page = tmp_path / "empty.html"
    empty_page.write_text(player_page(None), encoding="utf-8")
    with page_in(browser, tmp_path) as (page, problems):
        page.goto(empty_page.as_uri())
        assert "empty" in page.locator(".pkv-error").inner_text()
        page.goto(page_file.as_uri())
        for name in files:
            page.set_input_files("input.pkv-file", str(tmp_path / name))
            message = page.locator(".pkv-player .pkv-error")
            message.wait_for()
            assert says[name] in message.inner_text(), name
            assert message.inner_text().startswith("This trace cannot be played:")
        good = tmp_path / "good.json"
        good.write_text(get_run("prefix-hits").record().to_json(), encoding="utf-8")
        page.set_input_files("input.pkv-file", str(good))
        page.locator(".pkv-player .pkv-root").wait_for()
        assert "Prefix hits" in page.locator(".pkv-title").inner_text()
        assert not problems


def test_the_anywidget_front_end_syncs_the_step(browser, tmp_path):
    """player.js's default export driven by a stand-in for anywidget's model: the widget's wiring."""
    trace = get_run("fork").record()
    page_file = tmp_path / "widget.html"
    page_file.write_text(f"""<!DOCTYPE html><html><body><div id="w"></div><script type="module">
{PLAYER_JS.read_text()}
const state = {{trace: {trace.to_json()}, step: 2}}, handlers = {{}}, saved = [];
const model = {{get: (k) => state[k], set: (k, v) => {{ state[k] = v; }}, save_changes: () => saved.push(state.step),
  on: (e, f) => {{ handlers[e] = f; }}, off: (e) => {{ delete handlers[e]; }}}};
const cleanup = render({{model, el: document.getElementById("w")}});
window.widget = {{state, handlers, saved, cleanup}};
</script></body></html>""", encoding="utf-8")
    with page_in(browser, tmp_path) as (page, problems):
        page.goto(page_file.as_uri())
        page.locator("#w .pkv-root").wait_for()
        assert page.locator("#w").get_attribute("data-step") == "2"  # the model's step shown
        page.click(".pkv-forward")
        assert page.evaluate("widget.state.step") == 3 and page.evaluate("widget.saved") == [3]
        page.evaluate("widget.state.step = 6; widget.handlers['change:step']()")  # Python moved the step
        assert page.locator("#w").get_attribute("data-step") == "6"
        page.evaluate("widget.state.trace = {}; widget.handlers['change:trace']()")
        assert "no trace" in page.locator("#w .pkv-error").inner_text()
        page.evaluate("widget.cleanup()")
        assert page.evaluate("Object.keys(widget.handlers).length") == 0
        assert not problems
