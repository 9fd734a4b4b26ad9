"""Traces (pagedkv/viz/trace.py): every recorded step reads back as the very snapshot it was recorded from."""

import json
import re
from pathlib import Path

import pytest
import torch

from pagedkv import BlockSpaceManager, PagedKVCache
from pagedkv.__main__ import main
from pagedkv.errors import PagedKVValueError
from pagedkv.scheduler import Scheduler
from pagedkv.state import render_state
from pagedkv.v1 import KVCacheManager
from pagedkv.v1 import Scheduler as V1Scheduler
from pagedkv.viz.runs import RUNS, engine_v1, get_run
from pagedkv.viz.scheduler_widget import hybrid_groups
from pagedkv.viz.trace import TraceRecorder, load_trace, player_page, record_scheduler

ROOT = Path(__file__).resolve().parents[1]


class Watched:
    """A target whose every snapshot is kept, so a trace can be compared with what the manager really said."""

    def __init__(self, manager):
        self.manager, self.seen = manager, []

    def snapshot(self):
        self.seen.append(self.manager.snapshot())
        return self.seen[-1]


def replayed(trace, watched):
    """The trace through JSON and back; its states must be the snapshots taken."""
    back = load_trace(json.loads(trace.to_json()))
    assert len(back) == len(watched.seen)
    return back


def test_a_v1_scheduler_run_reads_back_as_its_snapshots():
    manager = KVCacheManager(block_size=4, num_gpu_blocks=8)
    watched = Watched(manager)
    scheduler = V1Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=8)
    prefix = list(range(50, 58))
    arrivals = {0: [("a", prefix + [1, 2, 3], 9), ("b", prefix + [4], 12)], 3: [("c", prefix + [5, 6], 10)]}
    trace = record_scheduler(scheduler, watched, arrivals=arrivals)
    back = replayed(trace, watched)
    assert back.states == watched.seen  # blocks, ref counts, hashes, free queue, tables, prefix stats: all equal
    assert back.texts == [render_state(s) for s in watched.seen]
    events = [f["event"] for f in back.frames]
    assert any("preempted" in e for e in events) and any(f["prefix_stats"]["hits"] for f in back.frames)


def test_a_hybrid_run_keeps_each_group_s_table_and_the_null_block():
    manager = KVCacheManager(4, 12, kv_cache_groups=hybrid_groups(4, 8), max_num_batched_tokens=8)
    watched = Watched(manager)
    trace = record_scheduler(V1Scheduler(manager, 4, 8), watched, arrivals={0: [("x", list(range(13)), 9)]})
    back = replayed(trace, watched)
    assert back.states == watched.seen
    assert back.data["null_block"] == manager.null_block is not None
    assert any("null" in text.split("->")[-1] for text in back.texts)  # a sliding table pointing at the null block


def test_a_v0_run_with_swapping_keeps_the_cpu_pool():
    manager = BlockSpaceManager(block_size=4, num_gpu_blocks=6, num_cpu_blocks=6, watermark=0.0)
    watched = Watched(manager)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=64, preemption_mode="swap")
    arrivals = {0: [("a", list(range(6)), 10), ("b", list(range(5)), 10)]}
    trace = record_scheduler(scheduler, watched, arrivals=arrivals)
    back = replayed(trace, watched)
    assert back.states == watched.seen
    assert any(f["event"].get("swapped_out") for f in back.frames)
    assert any(s.num_used("cpu") for s in back.states)


def test_hand_driven_copy_on_write_is_recorded_with_its_source():
    cache = PagedKVCache(num_gpu_blocks=6, block_size=4, num_kv_heads=1, head_size=1)
    trace = get_run("fork").record()
    cow = next(f for f in trace.frames if "copy-on-write" in f["label"])
    assert cow["event"]["copied"] and cow["event"]["sources"] == [cow["event"]["copied"][0][0]]
    assert cache.snapshot().num_used() == 0  # (the run makes its own cache)


def test_the_200_step_engine_run_is_under_300_kb():
    trace = engine_v1()
    assert len(trace) == 201  # the state before, then 200 steps
    assert len(trace.to_json().encode()) < 300_000
    assert trace.frames[-1]["counters"]["steps"] == 200


def test_every_run_belongs_to_a_notebook_of_the_course():
    names = {re.sub(r"^\d+_", "", p.stem) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert len({r.name for r in RUNS}) == len(RUNS)
    for run in RUNS:
        assert run.notebook in names, f"run {run.name}: no notebook named NN_{run.notebook}.ipynb"


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("   \n", "empty"), ("{not json", "not JSON"), ("[]", "format"),
    ('{"format": "pagedkv-trace", "version": 99}', "version 99"),
])
def test_a_bad_file_is_refused_with_what_is_wrong(text, says):
    with pytest.raises(PagedKVValueError, match=says):
        load_trace(text)


def test_an_edited_trace_is_refused():
    trace = get_run("free-list").record()
    data = json.loads(trace.to_json())
    data["steps"][1]["blocks"] = {"0": [1, [99], 4, -1]}  # an owner that is not in ids
    with pytest.raises(PagedKVValueError, match="block"):
        load_trace(data)
    data = json.loads(trace.to_json())
    data["steps"][-1]["text"] = ["a map that is not the state's"]
    with pytest.raises(PagedKVValueError, match="text map"):
        load_trace(data)
    data = json.loads(trace.to_json())
    del data["steps"][0]["free"]
    with pytest.raises(PagedKVValueError, match="whole state"):
        load_trace(data)


@pytest.mark.parametrize("edit", [
    lambda d: d["steps"][0].update(blocks=[1, 2]), lambda d: d["steps"].__setitem__(1, []),
    lambda d: d["steps"][1].update(seqs=[[0]] * 3 + ["x"]), lambda d: d["steps"][1].update(counters=5),
    lambda d: d["steps"][2].update(text=[[0, 1, 2, 3, 4]]), lambda d: d.update(ids=None),
])
def test_any_malformed_trace_is_a_pagedkv_error(edit):
    data = json.loads(get_run("fork").record().to_json())
    edit(data)
    with pytest.raises(PagedKVValueError, match="not a pagedkv trace"):
        load_trace(data)


def test_recorder_needs_a_snapshot():
    with pytest.raises(PagedKVValueError, match="snapshot"):
        TraceRecorder(object())


def test_the_page_holds_the_player_and_the_trace(tmp_path):
    trace = get_run("fork").record()
    page = player_page(trace)
    assert "export function mount" in page and '"format":"pagedkv-trace"' in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page


def test_the_command_line_writes_a_page_and_json(tmp_path, capsys):
    assert main(["trace", "prefix-hits", "--html", str(tmp_path / "run.html"), "--json", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "run.html").read_text().startswith("<!DOCTYPE html>")
    assert len(load_trace(tmp_path / "r.json")) > 5
    assert main(["trace", str(tmp_path / "r.json"), "--html", str(tmp_path / "again.html")]) == 0
    assert "Prefix hits" in (tmp_path / "again.html").read_text()
    (tmp_path / "empty.json").write_text("")
    assert main(["trace", str(tmp_path / "empty.json"), "--html", str(tmp_path / "x.html")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["trace", "no-such-run", "--html", str(tmp_path / "x.html")]) == 2
    assert "no run named" in capsys.readouterr().err
    assert main(["trace"]) == 0 and "engine-v1" in capsys.readouterr().out


def test_trace_player_widget_holds_the_trace():
    pytest.importorskip("anywidget")
    from pagedkv.viz.trace_widget import TracePlayer

    trace = get_run("free-list").record()
    player = TracePlayer(trace)
    assert player.trace == json.loads(trace.to_json()) and player.step == 0 and len(player) == len(trace)
    player.play(get_run("fork").record())
    assert player.trace["title"].startswith("A fork")
    assert "export default" in Path(player._esm).read_text() if isinstance(player._esm, Path) else player._esm
    with pytest.raises(PagedKVValueError):
        TracePlayer("")
    cache = PagedKVCache(num_gpu_blocks=4, block_size=2, num_kv_heads=1, head_size=1)
    recorder = TraceRecorder(cache, "live")
    cache.add_sequence("A", torch.zeros(3, 1, 1), torch.zeros(3, 1, 1))
    recorder.record("add A")
    player.follow(recorder)
    assert player.step == 1 and player.trace["steps"][1]["label"] == "add A"
