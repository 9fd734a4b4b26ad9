"""Recorded runs: how big a 200-step engine run's trace is, and how long the player takes to draw a step.

    python benchmarks/bench_trace.py

Size: the v1 engine on the tiny Llama (``pagedkv.viz.runs.engine_v1``: 20 requests, 40 blocks of 8, 200 steps),
as written by ``python -m pagedkv trace engine-v1 --json``; and a large pool (a v1 scheduler, 512 blocks of 16,
48 requests, a stand-in model, 200 steps), where the player draws without labels as ``draw_block_map`` does.
Draw: each trace's page (``--html``) in headless Chromium (Debian's, through Playwright); every step shown by the
player's ``show(i)``, then a forced layout (``getBoundingClientRect``), timed with ``performance.now()`` in the page;
median and worst of all steps, best of 3 passes. A benchmark, not a test: nothing asserts on it.
"""

import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pagedkv.v1 import KVCacheManager, Scheduler  # noqa: E402
from pagedkv.viz.runs import engine_v1  # noqa: E402
from pagedkv.viz.trace import record_scheduler  # noqa: E402

from _common import machine  # noqa: E402
from browser_helpers import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

DRAW_EVERY_STEP = """() => {
  const player = document.querySelector('.pkv-player'), times = [];
  for (let i = 0; i < player.pkv.count; i++) {
    const start = performance.now();
    player.pkv.show(i);
    player.getBoundingClientRect();  // style and layout done, as before the next frame
    times.push(performance.now() - start);
  }
  return times;
}"""


def large_pool_run():
    manager = KVCacheManager(block_size=16, num_gpu_blocks=512)
    scheduler = Scheduler(manager, max_num_seqs=32, max_num_batched_tokens=512)
    arrivals = {4 * i: [(f"q{i}", [7] * 64 + list(range(i * 100, i * 100 + 40 + 13 * (i % 7))), 120 + 20 * (i % 5))]
                for i in range(48)}
    return record_scheduler(scheduler, manager, "512 blocks", arrivals=arrivals, max_steps=200)


def main() -> None:
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}")
    runs = []
    for name, make in (("v1 engine, tiny Llama, 40 blocks", engine_v1), ("v1 scheduler, 512 blocks", large_pool_run)):
        start = time.perf_counter()
        trace = make()
        seconds = time.perf_counter() - start
        text = trace.to_json()
        frames = trace.frames
        full = sum(len(json.dumps({k: f[k] for k in ("blocks", "free", "seqs", "text")})) for f in frames)
        print(f"{name}: {len(trace) - 1} steps, trace {len(text.encode()) / 1000:.0f} KB "
              f"(gzip {len(gzip.compress(text.encode())) / 1000:.0f} KB; every step in full: {full / 1000:.0f} KB), "
              f"recorded in {seconds:.1f} s")
        runs.append((name, trace))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("draw: skipped (no Playwright)")
        return
    if not os.path.exists(CHROMIUM):
        print(f"draw: skipped (no Chromium at {CHROMIUM})")
        return
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for name, trace in runs:
                path = trace.write_html(Path(folder) / "run.html")
                page.goto(path.as_uri())
                passes = [page.evaluate(DRAW_EVERY_STEP) for _ in range(3)]
                best = min(passes, key=statistics.median)
                print(f"draw, {name}: median {statistics.median(best):.1f} ms a step, worst {max(best):.1f} ms "
                      f"({len(best)} steps, best of 3 passes)")
        finally:
            browser.close()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
