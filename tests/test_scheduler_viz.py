"""The scheduler timeline and the scheduler visualizer: plain methods, no browser."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pagedkv import BlockSpaceManager  # noqa: E402
from pagedkv.scheduler import Scheduler  # noqa: E402
from pagedkv.viz import SchedulerVisualizer, Timeline, draw_timeline  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def recorded(mode="recompute"):
    scheduler = Scheduler(BlockSpaceManager(2, 6, num_cpu_blocks=8, watermark=0.0), max_num_seqs=4,
                          max_num_batched_tokens=16, preemption_mode=mode)
    for name in ("r0", "r1", "r2"):
        scheduler.add_request(name, [7, 7], max_tokens=6)
    timeline = Timeline()
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        timeline.record(scheduler, out)
        scheduler.update(out, dict.fromkeys(out.scheduled, 1))
    return timeline


def test_timeline_rows_tell_each_requests_story():
    timeline = recorded()
    assert timeline.requests == ["r0", "r1", "r2"]  # arrival order
    assert timeline.row("r2").startswith("PDDX...P")  # preempted at step 3, waits, prefilled again
    assert timeline.finished_at("r0") == 5 and timeline.row("r0") == "PDDDDD    "
    text = str(timeline)
    assert text.splitlines()[0].startswith("step  0123") and "X preempted" in text
    assert "S swapped" in str(recorded("swap"))


def test_draw_timeline_has_a_key_for_every_state_shown():
    ax = draw_timeline(recorded("swap"), title="t")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["prefill (prompt K/V computed)", "decode (one token)", "swapped out to CPU",
                      "preempted this step"]
    assert len(ax.patches) == sum(len(s) for s in recorded("swap").steps)


def test_scheduler_visualizer_steps_and_reports():
    viz = SchedulerVisualizer(num_gpu_blocks=10, block_size=4, num_requests=5, seed=1)
    assert viz.scheduler.waiting == ["r0", "r1", "r2", "r3", "r4"]
    assert viz.step(3) == 3 and len(viz.timeline.steps) == 3
    assert viz.message.startswith("step 2:") and "running" in viz.status_text()
    while viz.step(10):
        pass
    assert viz.message.startswith("every request has finished")
    assert len(viz.scheduler.finished) == 5 and viz.manager.num_free_gpu_blocks == 10
    assert viz.add_request(3, 2) == "r5" and viz.step() == 1


def test_scheduler_visualizer_bad_settings_change_nothing():
    viz = SchedulerVisualizer(num_gpu_blocks=10, num_requests=2)
    viz.step()
    before = (viz.settings, viz.scheduler.running)
    for bad in ({"preemption_mode": "drop"}, {"num_gpu_blocks": -1}, {"block_size": 0}, {"colour": "red"},
                {"num_requests": "3"}):
        assert viz.reset(**bad) is False and viz.message.startswith("reset failed")
        assert (viz.settings, viz.scheduler.running) == before
    assert viz.step("2") == 0 and "integer" in viz.message
    viz.reset(preemption_mode="swap", num_gpu_blocks=6)
    assert viz.scheduler.preemption_mode.value == "swap" and viz.manager.num_total_gpu_blocks == 6
    assert viz.add_request(0, 1) is None and "empty" in viz.message  # refused, with the reason shown


def test_scheduler_visualizer_buttons_call_the_methods():
    viz = SchedulerVisualizer(num_gpu_blocks=10, num_requests=3)
    viz.buttons["step"].click()
    viz.buttons["5 steps"].click()
    assert len(viz.timeline.steps) == 6
    viz.mode.value = "swap"
    viz.buttons["reset"].click()
    assert viz.settings["preemption_mode"] == "swap" and viz.timeline.steps == []


def test_scheduler_visualizer_refuses_bad_settings_at_construction():
    from pagedkv import PagedKVError

    for bad in ({"num_gpu_blocks": 0.5}, {"preemption_mode": "drop"}, {"block_size": -1}):
        with pytest.raises(PagedKVError):
            SchedulerVisualizer(**bad)


def test_the_v1_mode_chunks_prompts_under_its_budget_and_draws_chunks_as_partial_bars():
    """Issue #26: the scheduler visualizer and the timelines gain vLLM v1's scheduler."""
    viz = SchedulerVisualizer(version="v1", num_gpu_blocks=12, block_size=4, num_requests=0,
                              max_num_batched_tokens=6)
    viz.add_request(14, 3)
    viz.add_request(2, 3)
    assert viz.step() == 1 and viz.message.startswith("step 0:  budget 6/6 tokens: r0 6 of 14")
    viz.step(10)
    assert viz.timeline.row("r0").startswith("ppP")  # two chunks, then the last one samples
    assert "p chunk" in str(viz.timeline) and "v1: running" in viz.status_text()
    assert len(viz.scheduler.finished) == 2 and viz.manager.num_free_blocks == 12
    ax = draw_timeline(viz.timeline)
    heights = sorted({round(p.get_height(), 2) for p in ax.patches})
    assert heights == [0.42, 0.85]  # chunks are half-height prefill bars
    viz.mode.value = "swap"
    viz.buttons["reset"].click()
    assert viz.settings["version"] == "v0" and viz.scheduler.preemption_mode.value == "swap"
    viz.mode.value = "v1"
    viz.buttons["reset"].click()
    assert viz.settings["version"] == "v1" and viz.status_text().startswith("v1")
    assert viz.reset(version="v2") is False and "version" in viz.message


def test_the_key_stays_clear_of_the_timelines_step_labels():
    """Issue #38: the block map's key, under the figure, overprinted the timeline's x-axis labels."""
    sv = SchedulerVisualizer(num_gpu_blocks=12, block_size=4, num_requests=5)
    sv.step(8)
    fig = sv.figure()
    renderer = fig.canvas.get_renderer()
    key = fig.legends[0].get_window_extent(renderer)
    timeline = fig.axes[1].get_tightbbox(renderer)  # its tick labels, "step" and its own key included
    assert key.y1 <= timeline.y0 + 1e-6


def test_a_hybrid_model_shows_each_requests_table_per_group_and_the_null_block():
    """Issue #35: v1 with a sliding window keeps two tables per request over one pool; the window's old blocks
    become the null block, and the group dropdown picks whose tables the map and the text map show."""
    viz = SchedulerVisualizer(version="v1", sliding_window=8, num_gpu_blocks=16, block_size=4, num_requests=0,
                              max_num_batched_tokens=8)
    assert viz.group_names == ("sliding 8", "full") and viz.group_select.layout.display == ""
    viz.add_request(10, 12)
    viz.step(5)  # 13 tokens computed: the last one sees positions 5..12, so block 0 left the window
    null = viz.manager.null_block
    sliding, full = viz.manager.get_block_ids("r0")
    assert sliding[0] == null and null not in sliding[1:] and null not in full and len(full) == 4
    text = viz.map_text()
    # issue #48: a named sliding block is starred (0.33's default names only the run before the replay boundary)
    assert f"sliding 8 -> [null, {', '.join(map(str, sliding[1:]))}]" in text.replace("*", "")
    assert "sliding 8 -> [null, 2*, 5, 7]" in text
    assert f"full      -> {full}" in text and "null block" in text
    labels = [t.get_text() for t in viz.figure().axes[0].texts]
    assert {"seq r0 · sliding 8", "seq r0 · full", "null"} <= set(labels)

    viz.group_select.value = "full"  # the dropdown calls show_group
    assert viz.group == "full" and f"full -> {full}" in viz.map_text() and "sliding 8 ->" not in viz.map_text()
    labels = [t.get_text() for t in viz.figure().axes[0].texts]
    assert "seq r0 · full" in labels and "seq r0 · sliding 8" not in labels
    assert viz.show_group("sliding 8") and viz.group_select.value == "sliding 8"
    assert "sliding 8 -> [null," in viz.map_text() and "full ->" not in viz.map_text()
    assert viz.show_group("sliding 4") is False and viz.group == "sliding 8" and "not a KV cache group" in viz.message
    viz.step(20)
    assert len(viz.scheduler.finished) == 1 and viz.manager.num_free_blocks == 15  # all back but the null block
    assert f"GPU blocks 1/16 used, block {null} being the null block" in viz.status_text()
    assert viz.show_group(None) and viz.group_select.value == "every group"


def test_the_hybrid_mode_comes_from_the_controls_and_needs_v1():
    viz = SchedulerVisualizer(num_gpu_blocks=16, num_requests=2)
    assert viz.group_names == () and viz.group_select.layout.display == "none" and "null" not in viz.map_text()
    viz.mode.value = "v1 hybrid"
    viz.buttons["reset"].click()
    assert viz.settings["sliding_window"] == 8 and viz.group_names == ("sliding 8", "full")
    viz.show_group("full")
    viz.mode.value = "v1"
    viz.buttons["reset"].click()
    assert viz.group is None and viz.group_names == () and viz.group_select.layout.display == "none"
    before = viz.settings
    assert viz.reset(version="v0", sliding_window=8) is False and "needs version='v1'" in viz.message
    assert viz.reset(sliding_window=0) is False and viz.settings == before


def test_token_budget_draws_each_steps_tokens_against_the_budget():
    """A v1 run drawn as tokens per step: one bar segment per request and step, chunks hatched, a preemption
    marked X, the budget a dashed line; the text map says the same numbers."""
    from pagedkv.errors import PagedKVValueError
    from pagedkv.v1 import KVCacheManager
    from pagedkv.v1 import Scheduler as V1Scheduler
    from pagedkv.viz import draw_token_budget, token_budget_text

    scheduler = V1Scheduler(KVCacheManager(block_size=4, num_gpu_blocks=6), max_num_batched_tokens=16)
    for name, start, length in (("X", 100, 9), ("Y", 200, 5), ("Z", 300, 7)):
        scheduler.add_request(name, list(range(start, start + length)), 6)
    timeline = Timeline()
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        timeline.record(scheduler, out)
        scheduler.update_from_output(out, dict.fromkeys(scheduler.sampling_request_ids(out), 1))
    assert timeline.tokens[0] == {"X": 9, "Y": 5} and timeline.total_tokens()[:2] == [14, 2]  # Z waits: the gate
    ax = draw_token_budget(timeline, budget=16, steps=range(8))
    assert len(ax.patches) == sum(len(timeline.tokens[s]) for s in range(8))
    assert [t.get_text() for t in ax.texts] == ["X"]  # Y preempted in step 4
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["X", "Y", "Z", "X: preempted in this step", "the budget: 16 tokens"]
    text = token_budget_text(timeline, budget=16, steps=range(8)).splitlines()
    assert text[0].split() == ["step", *map(str, range(8))]
    assert text[2].split()[:6] == ["Y", "5P", "1D", "1D", "1D", "X"] and text[4].split()[1:3] == ["14", "2"]
    assert text[-1] == "the largest step holds 14 tokens; the budget is 16"
    with pytest.raises(PagedKVValueError, match="step numbers"):
        draw_token_budget(timeline, steps=[99])
