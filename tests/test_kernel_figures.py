"""Notebook 08's and 11's pictures: what they say is the kernels' own arithmetic, and the static estimates are fresh."""

import json
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from perf_extra import real_mode_env, require_perf_extra  # noqa: E402

from pagedkv.labs.exercises import _kernel_lane_work  # noqa: E402
from pagedkv.labs.exercises import lane_work as exercise_lane_work  # noqa: E402
from pagedkv.viz import kernel_figures as kf  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_lane_work_is_the_kernels_layout_and_out_of_reach():
    """Notebook 08's E1 answer is no function of the package's under its name (the kernel writes the two index lines
    inline), and the grader's reference repeats those lines: each lane's share of a block, all lanes together
    every (token, word) of it exactly once."""
    import inspect

    from pagedkv.kernels import cuda_vllm

    assert not hasattr(kf, "lane_work") and not hasattr(cuda_vllm, "lane_work")
    kernel = inspect.getsource(cuda_vllm.grouped_phases)
    assert "offset = group + t * groups_per_warp" in kernel and "w = rank" in kernel and "w += group_size" in kernel
    for lane, block_size, words in ((0, 16, 32), (5, 16, 32), (31, 8, 16), (3, 64, 32), (9, 1, 64)):
        assert exercise_lane_work(lane, block_size, words) == _kernel_lane_work(lane, block_size, words)
    for block_size, words in ((1, 64), (4, 8), (8, 16), (16, 32), (32, 32), (64, 32), (128, 16)):
        reads = [(t, w) for lane in range(32) for tokens, lane_words in [_kernel_lane_work(lane, block_size, words)]
                 for t in tokens for w in lane_words]
        assert sorted(reads) == [(t, w) for t in range(block_size) for w in range(words)], block_size


def test_mapping_text_names_each_warps_blocks_through_the_table():
    table = [7, 2, 11, 5, 9, 0, 4]
    text = kf.kernel_mapping_text(table, 100, num_heads=4, num_seqs=3)
    assert "(4, 3): 12 thread blocks" in text and "100 tokens in 7 blocks of 16" in text
    assert "warp 0: logical blocks 0, 4 -> physical 7, 9" in text
    assert "warp 3: logical blocks 3 -> physical 5" in text
    assert "16 thread groups of 2 lanes" in text and "fetches 16 bytes" in text  # vLLM's VEC_SIZE arithmetic
    assert "holds 4 of its 16 slots: 8 of the warp's 32 lanes work on a real token" in text
    m = kf.kernel_mapping(table, 100, num_heads=4, num_seqs=3)
    assert (m.warp_blocks[1], m.physical[1], m.loads_per_lane, m.last_block_lanes) == ([1, 5], [2, 0], 16, 8)
    # the lanes with a real token in the last block, counted from the grader's lane-by-lane reference
    for block_size, seq_len in ((16, 100), (8, 100), (64, 100), (1, 7), (32, 64)):
        m = kf.kernel_mapping(list(range(100)), seq_len, 4, 3, block_size=block_size)
        last = seq_len - (m.num_blocks - 1) * block_size
        busy = [lane for lane in range(32) if min(_kernel_lane_work(lane, block_size, m.words)[0]) < last]
        assert m.last_block_lanes == len(busy), block_size
    assert kf.kernel_mapping_figure(table, 100, 4, 3).axes


def test_layout_orders_follow_each_shape():
    orders = kf.layout_orders(block_size=4, head_size=16)
    ours, key, value = orders.values()
    assert ours[:3] == [(0, 0), (0, 1), (0, 2)] and ours[16] == (1, 0)
    assert key[:9] == [(0, d) for d in range(8)] + [(1, 0)]  # an x-vector of 8 fp16 values, then the next token
    assert key[32] == (0, 8)  # after every token's first vector, token 0's second
    assert value[:5] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
    assert all(sorted(o) == sorted(ours) for o in orders.values())  # the same elements, reordered
    assert kf.cache_layout_figure().axes and "vLLM key" in kf.cache_layout_text()


def test_partition_weights_rebuild_the_whole_softmax():
    g = torch.Generator().manual_seed(0)
    logits, values = torch.randn(20, generator=g) * 3, torch.randn(20, 4, generator=g)
    stats = kf.partition_stats(logits, 8)
    assert [(p["start"], p["end"]) for p in stats] == [(0, 8), (8, 16), (16, 20)]
    assert sum(p["weight"] for p in stats) == pytest.approx(1.0)
    combined = sum(p["weight"] * (torch.softmax(logits[p["start"]:p["end"]], 0) @ values[p["start"]:p["end"]])
                   for p in stats)
    torch.testing.assert_close(combined, torch.softmax(logits, 0) @ values, atol=1e-5, rtol=1e-5)
    assert "3 thread blocks" in kf.v2_partitions_text(logits, 8)
    assert kf.v2_partitions_figure(logits, 8).axes


def test_gqa_text_counts_blocks_and_reads():
    text = kf.gqa_text(8, 2)
    assert "KV head 1: query heads 4, 5, 6, 7" in text
    assert "8 thread blocks per sequence; each KV head's K/V is read 4 times" in text
    assert "2 thread blocks per sequence; read once" in text and "bytes" not in text
    assert kf.gqa_reads(8, 2, 1000) == {"vllm": (8, 2_048_000), "vllm-gqa": (2, 512_000)}  # 1,000 x 128 x 2 each
    assert "vllm 2,048,000 bytes, vllm-gqa 512,000 bytes" in kf.gqa_text(8, 2, seq_len=1000)
    assert kf.gqa_reads(32, 8, 10)["vllm-gqa"][0] == 8 and kf.gqa_reads(4, 4, 10)["vllm"] == (4, 10240)
    assert len(kf.gqa_figure(8, 2).axes) == 2


def test_static_estimates_meet_the_kernel_issue_targets():
    """The shipped estimates (sm_90, head 128, fp16): the grouped kernel <= 40 warp instructions per (query head,
    token) at GQA 4, the vLLM-shaped one <= 60 at MHA, occupancy >= 50%, nothing spilled."""
    points = {(p["flavour"], p["gqa"]): p for p in kf.estimate_points(kf.load_static_estimates())}
    assert points[("vllm-gqa", 4)]["instructions"] <= 40 and points[("vllm", 1)]["instructions"] <= 60
    assert points[("vllm-gqa", 1)]["instructions"] <= 60
    rows = [r for r in kf.load_static_estimates() if r.get("flavour") not in (None, "tree")]
    assert all(r["occupancy"] >= 0.5 and r["spill_bytes"] == 0 and r["sm"] == "sm_90" for r in rows)
    assert "static estimate, not measured" in kf.static_estimates_text(kf.load_static_estimates())
    assert kf.static_estimates_figure(kf.load_static_estimates()).axes


def test_static_estimates_of_the_unified_kernel_meet_issue_45():
    """The unified kernel's shipped rows (sm_90, head 128, fp16), warp instructions per (query head, key): a decode
    tile <= 25 at GQA 4 and <= 40 at MHA, a prefill tile <= 40; occupancy at least the 37.5% it had before, and
    nothing spilled."""
    tiles = {(r["tile"], r["gqa"]): r for r in kf.load_static_estimates() if "tile" in r}
    assert set(tiles) == {("prefill", 1), ("decode", 1), ("prefill", 4), ("decode", 4)}
    total = {key: sum(r["loops"].values()) for key, r in tiles.items()}
    assert total["decode", 4] <= 25 and total["decode", 1] <= 40
    assert total["prefill", 1] <= 40 and total["prefill", 4] <= 40
    assert all(r["occupancy"] >= 0.375 and r["sm"] == "sm_90" and r["head_size"] == 128 for r in tiles.values())
    assert all(r["spill_bytes"] == 0 for r in tiles.values())
    text = kf.unified_estimates_text(kf.load_static_estimates())
    assert text.startswith("static estimate, not measured") and "decode tile (1 query x 4 heads)" in text


def test_the_shipped_estimate_is_what_the_report_measures_now():
    """Re-measure the grouped kernel's row: the JSON the notebook draws must not go stale as the kernel changes."""
    require_perf_extra()
    code = ("import json; from pagedkv.kernels.static_report import measure; "
            "print(json.dumps(measure('vllm-gqa', 'v1', 128, (9, 0), gqa=4)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=real_mode_env(PAGEDKV_QUIET="1"))
    assert r.returncode == 0, r.stderr
    fresh = json.loads(r.stdout.strip().splitlines()[-1])
    shipped = next(row for row in kf.load_static_estimates()
                   if (row["flavour"], row["kernel"], row["gqa"]) == ("vllm-gqa", "v1", 4))
    assert fresh == shipped, "re-run: python -m pagedkv.kernels.static_report --cc 9.0 --head-size 128 " \
                             "--kernel v1 v2 unified --gqa 1 4 --json pagedkv/data/static_estimates.json"


def test_chunk_reads_follow_the_causal_offset_and_the_window():
    # two sequences: a chunk of 3 rows ending a 7-token sequence, and a decode of a 5-token one
    cu, lens, tables = [0, 3, 4], [7, 5], [[4, 9], [2, 6]]
    rows = kf.chunk_reads(cu, lens)
    assert [r["position"] for r in rows] == [4, 5, 6, 4]
    assert [len(r["keys"]) for r in rows] == [5, 6, 7, 5]
    windowed = kf.chunk_reads(cu, lens, sliding_window=3)
    assert [(r["keys"][0], r["keys"][-1]) for r in windowed] == [(2, 4), (3, 5), (4, 6), (2, 4)]
    # the same rows from a dense causal mask with an offset, built independently in torch
    q_len, seq_len = 3, 7
    mask = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len)
    assert mask.sum(1).tolist() == [len(r["keys"]) for r in rows[:3]]
    text = kf.chunk_reads_text(cu, lens, tables, block_size=4, sliding_window=3)
    assert "row  0 (seq 0, position  4): keys  2-4  ( 3) in pages [4, 9]" in text
    assert "key positions read in all: 12" in text
    assert kf.chunk_reads_figure(cu, lens, tables, 4).patches


def test_unread_pages_are_those_before_every_window():
    cu, lens, tables = [0, 5, 6, 10], [13, 10, 4], [[0, 1, 2, 3], [4, 5, 6, 0], [7, 0, 0, 0]]
    assert kf.unread_pages(cu, lens, tables, 4) == []  # causal: a sequence's last row reads all its pages
    assert kf.unread_pages(cu, lens, tables, 4, sliding_window=4) == [0, 4]
    assert "no row reads: [0, 4]" in kf.chunk_reads_text(cu, lens, tables, 4, sliding_window=4)


def test_unified_grid_is_the_launch_the_kernel_makes():
    """The drawn grid comes from the kernel's own launch rules; its tiles cover every query row exactly once, and
    the spare ones are the slack of vLLM's upper bound, num_tokens // BLOCK_Q + num_seqs."""
    from pagedkv.kernels.cuda_unified import tile_owner

    step = kf.unified_grid([0, 1, 2, 3, 16], [7, 7, 7, 26], 4, 2, head_size=8, block_size=4)
    assert step.plan.block_q == 8 and step.plan.grid == (16 // 8 + 4, 2, 1)
    assert step.tiles == [(0, 0, 1), (1, 1, 1), (2, 2, 1), (3, 3, 8), (3, 11, 5), None]
    text = kf.unified_grid_text(step)
    assert "tile 4: seq 3, rows 11-15: 5 of its 8 queries, prefill tile, keys 0-25" in text
    assert "tile 0: seq 0, row 0: 1 of its 8 queries, decode tile, keys 0-6" in text and "tile 5: spare" in text
    for cu, block_q in (([0, 1, 2, 3, 16], 8), ([0, 16, 17, 40], 4), (list(range(10)), 1), ([0, 7, 9], 2)):
        tiles = [tile_owner(cu, t, block_q) for t in range(cu[-1] // block_q + len(cu) - 1)]
        rows = [r for tile in tiles if tile for r in range(tile[1], tile[1] + tile[2])]
        assert rows == list(range(cu[-1])), (cu, block_q)
        assert sum(t is not None for t in tiles) == sum(-(-(b - a) // block_q) for a, b in zip(cu, cu[1:]))
    # three long decodes, 6 (sequence, KV head) programs: 3-D, segments of one 512-key partition, and the reduce
    long = kf.unified_grid([0, 1, 2, 3], [8192, 3000, 700], 4, 2, head_size=128, block_size=16, dtype="float16")
    assert long.plan.grid == (6, 2, 16) and long.plan.segment_len == 512
    text = kf.unified_grid_text(long)
    assert "segments 0-5, the last with 440; segments 6-15 return" in text
    assert "12 programs, each merging its row's partial max, sum and output (16, 6, 2 segments)" in text
    assert len(kf.unified_grid_figure(step, long).axes) == 2


def test_split_calls_say_whose_rows_each_call_covers():
    """One layer's attention calls: the text names each call's rows and their requests, in forward's order, and counts
    the calls over the layers; the figure draws a box per call under the rows."""
    q_lens, names = [1, 1, 1, 13], ["d0", "d1", "d2", "long"]
    calls = {"Triton": [("unified_attention", range(16))],
             "FlashInfer": [("prefill", range(3, 16)), ("decode", range(3))]}
    text = kf.split_calls_text(q_lens, names, calls, 32, label="the step")
    assert text.startswith("the step: 16 query rows, q_lens [1, 1, 1, 13] (d0, d1, d2, long)")
    assert "1. unified_attention, rows 0-15 (d0, d1, d2, long)" in text and "1 call a layer, 32 over 32 layers" in text
    assert "1. prefill, rows 3-15 (long)" in text and "2. decode, rows 0-2 (d0, d1, d2)" in text
    assert "2 calls a layer, 64 over 32 layers" in text
    ax = kf.split_calls_figure(q_lens, names, calls, 32).axes[0]
    assert len(ax.patches) == 16 + 3  # a cell per query row, a box per call
    assert kf._rows_owned([5, 1, 4], ["a", "b", "c"], range(4, 7)) == ["a", "b", "c"]
