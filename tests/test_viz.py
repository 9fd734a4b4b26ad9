import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pagedkv import BlockSpaceManager  # noqa: E402
from pagedkv.viz import BlockTableVisualizer, draw_block_map, seq_colors  # noqa: E402
from pagedkv.viz.figures import FIGURES, make_all_figures  # noqa: E402


def texts(ax):
    return [t.get_text() for t in ax.texts]


def collection(ax, gid):
    return next(c for c in ax.collections if c.get_gid() == gid)


def cells(ax):
    """The outlines of the physical blocks: one per block."""
    return collection(ax, "block_outlines").get_paths()


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_empty_pool():
    ax = draw_block_map(BlockSpaceManager(4, 8).snapshot())
    assert len(cells(ax)) == 8
    assert "#0" in texts(ax) and "#7" in texts(ax)  # free-queue positions


def test_shared_blocks_show_ref_counts_and_stripes():
    m = BlockSpaceManager(4, 8)
    m.allocate("a", range(6))
    m.fork("a", "b")
    ax = draw_block_map(m.snapshot())
    assert texts(ax).count("x2") == 2
    fills = collection(ax, "fills").get_paths()
    assert len(fills) == 6 + 2 * 2 * 2 + 2 * 2  # free cells, 2 stripes x (empty + filled) x 2, table entries
    assert "seq a" in texts(ax) and "seq b" in texts(ax)


def test_swapped_and_highlighted():
    m = BlockSpaceManager(4, 8, num_cpu_blocks=4)
    m.allocate("a", range(6))
    m.swap_out("a")
    ax = draw_block_map(m.snapshot(), highlight=[("cpu", 0)])
    assert len(cells(ax)) == 12  # both pools drawn
    assert "CPU pool (4 blocks)" in texts(ax) and "0c" in texts(ax)
    assert sum(w > 2 for w in collection(ax, "block_outlines").get_linewidths()) == 1


def test_prefix_cached_blocks_show_their_hash():
    m = BlockSpaceManager(4, 8, enable_prefix_caching=True)
    m.allocate("a", range(9))
    name = m.snapshot().blocks[0].block_hash[:4]
    m.free("a")
    ax = draw_block_map(m.snapshot())
    assert name in texts(ax)


def test_large_pools_drop_labels():
    m = BlockSpaceManager(16, 256)
    for i in range(20):
        m.allocate(i, range(150))
    ax = draw_block_map(m.snapshot())
    assert len(cells(ax)) == 256 and "#0" not in texts(ax)


# ------------------------------------------------------------------ the widget


def test_visualizer_controls_drive_the_cache():
    v = BlockTableVisualizer(block_size=4, num_gpu_blocks=16, num_cpu_blocks=4)
    a = v.add_sequence(6)
    assert v.counters()["blocks_used"] == 2 and v.seq_menu.options == (("A", a),) and v.seq_menu.value == a
    assert v.append(a, 3) and v.manager.get_num_tokens(a) == 9
    b = v.fork(a)
    assert v.manager.get_block_table(b) == v.manager.get_block_table(a)
    assert v.seq_menu.value == b  # the newest sequence is selected
    v.append(b, 1)
    assert v.last_touched  # the copy-on-write block is highlighted
    assert v.swap_out(a) and v.manager.get_device(a) == "cpu"
    assert v.swap_in(a) and v.manager.get_device(a) == "gpu"
    assert v.free(b) and b not in v.seq_ids
    assert v.beam_step() and v.beam_step()
    assert v.message.startswith("beam step 1")
    assert "blocks used" in v.counters_text()
    assert v.log[:3] == ["add A (6 tokens)", "append 3 to A", "fork A -> B"]
    assert v.output.outputs == ()  # not on screen: nothing drawn
    v._ipython_display_()
    v.append(a, 1)
    assert len(v.output.outputs) <= 1  # redrawn in place, not stacked


def test_errors_become_messages_and_change_nothing():
    v = BlockTableVisualizer(block_size=4, num_gpu_blocks=4, num_cpu_blocks=0)
    v.add_sequence(8)
    before = v.snapshot()
    assert v.add_sequence(100) is None and "needs 25 free GPU blocks" in v.message
    assert not v.append("nope") and "unknown sequence" in v.message
    assert not v.swap_out("A") and "CPU" in v.message  # no CPU pool room
    assert not v.append("A", 50) and "free GPU blocks" in v.message
    assert v.snapshot() == before
    assert "color:#B00" in v.message_html.value


def test_reset_applies_settings_and_prefix_caching_counts_hits():
    v = BlockTableVisualizer()
    v.reset(block_size=2, num_gpu_blocks=10, enable_prefix_caching=True)
    v.add_sequence(5, reuse_prompt=True)
    v.add_sequence(5, reuse_prompt=True)
    assert v.manager.block_size == 2 and v.counters()["hit_rate"] == 0.5
    assert "prefix hit rate 50%" in v.counters_text()


def test_visualizer_watches_a_given_manager():
    m = BlockSpaceManager(4, 8)
    v = BlockTableVisualizer(m)
    v.add_sequence(3)
    assert m.seq_ids == ["A"]


# ------------------------------------------------------------------ figures


def test_figures_regenerate_deterministically(tmp_path):
    first = make_all_figures(tmp_path / "a")
    second = make_all_figures(tmp_path / "b")
    assert [p.name for p in first] == [n for png in FIGURES for n in (png, png.replace(".png", ".svg"))]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(first, second))


@pytest.mark.parametrize("name", list(FIGURES))
def test_figure_text_reads_at_readme_width(name):
    """No text under 8 pt once GitHub shrinks the PNG to its README column."""
    from pagedkv.viz.figures import smallest_text_at_readme_width

    fig = FIGURES[name]()
    try:
        assert smallest_text_at_readme_width(fig) >= 8, name
    finally:
        plt.close(fig)


def test_a_wide_figure_is_measured_as_shrunk():
    from pagedkv.viz.figures import smallest_text_at_readme_width

    fig, ax = plt.subplots(figsize=(16, 3))
    ax.set_title("9 pt on a 16-inch figure", fontsize=9)
    ax.axis("off")
    assert smallest_text_at_readme_width(fig) < 8
    plt.close(fig)


def test_buttons_wait_for_a_sequence_and_news_is_not_an_error():
    v = BlockTableVisualizer(block_size=4, num_gpu_blocks=16)
    assert all(v.buttons[b].disabled for b in ("append", "fork", "free", "swap out", "swap in"))
    assert v.buttons["append"].tooltip == "add a sequence first" and not v.buttons["add sequence"].disabled
    v.add_sequence(5)
    assert not any(v.buttons[b].disabled for b in ("append", "fork", "free", "swap out", "swap in"))
    assert v.beam_step(5) and v.beam_step(5) and "beams hold" in v.message
    assert "color:#B00" not in v.message_html.value  # a beam step's news is not shown as an error
    v.free("A")
    assert not v.buttons["append"].disabled  # the beam's sequences are still there


def test_more_than_ten_sequences_get_distinct_colours():
    m = BlockSpaceManager(block_size=2, num_gpu_blocks=40)
    for i in range(18):
        m.allocate(f"s{i}", [i, i])
    colors = list(seq_colors(m.snapshot()).values())
    assert len(set(colors)) == 18


def test_the_beam_message_counts_the_beams_blocks_on_both_sides():
    """Issue #29: 'blocks in use' counted the whole pool, 'without sharing' only the beams. Review 07-s4r4: the
    notebook read ``beams.beam.steps[1]``; ``last_step`` is the last click's StepStats."""
    v = BlockTableVisualizer(num_gpu_blocks=24, block_size=4, beam_width=3)
    v.add_sequence(9)  # another sequence's 3 blocks must not count
    assert v.last_step is None
    assert v.beam_step(6) and v.message.startswith("beam search started: a 6-token prompt in 2 blocks")
    assert v.last_step is v.beam.steps[0]
    for click in range(3):
        assert v.beam_step(6)
        tables = list(v.beam.block_tables().values())
        held, alone = len({b for t in tables for b in t}), sum(map(len, tables))
        assert f"the {len(tables)} beams hold {held} blocks (without sharing: {alone})" in v.message
        assert held <= alone
        assert v.last_step is v.beam.steps[click + 1] and f" {v.last_step.cow_copies} copy" in v.message


def test_the_beam_step_is_the_engines_beam_search_and_its_sequences_are_the_engines():
    """Issue #25: one serving loop. The clicks run LLMEngine on the tiny Llama; the result is beam_search_dense's."""
    from pagedkv import BeamSearchParams, beam_search_dense
    from pagedkv.decoding import tiny_model
    from pagedkv.viz.visualizer import BEAM_TOKENS

    v = BlockTableVisualizer(num_gpu_blocks=48, block_size=4, beam_width=3)
    v.add_sequence(5)
    assert v.beam_step(7)
    prompt = v.engine.scheduler.requests["beam"].prompt_token_ids
    beam = v.beam.seq_ids[1]
    assert not v.free(beam) and "belong to the engine" in v.message and v.manager.has_seq(beam)
    assert v.seq_menu.options[-1][0].startswith("beam.")  # ("beam", i) is written beam.i
    while v.beam_output is None:
        assert v.beam_step(7) and not v.message_is_error
    assert v.message.startswith(f"beam search finished after {BEAM_TOKENS} tokens")
    want = beam_search_dense(tiny_model(), prompt, BeamSearchParams(beam_width=3, max_tokens=BEAM_TOKENS,
                                                                     ignore_eos=True))
    assert [o.token_ids for o in v.beam_output.outputs] == [o.token_ids for o in want.outputs]
    assert v.manager.seq_ids == ["A"]  # every beam's blocks went back; the hand-made sequence stays
    assert v.beam_step(7) and v.message.startswith("beam search started")  # and a new one starts


def test_a_beam_search_too_big_for_the_pool_is_refused_with_its_numbers():
    v = BlockTableVisualizer(num_gpu_blocks=4, block_size=4, beam_width=3)
    before = v.snapshot()
    assert not v.beam_step(6) and "need up to 6 blocks of 4, more than the pool's 4" in v.message
    assert v.snapshot() == before and v.engine is None


def test_a_sequence_keeps_its_colour_and_the_map_its_scale_while_the_pool_is_the_same():
    """Issue #29: freeing a sequence recoloured the others, and the map rescaled between clicks."""
    from pagedkv.viz.block_map import PALETTE

    v = BlockTableVisualizer(num_gpu_blocks=24, block_size=4)
    v._displayed = True
    a, b, c = v.add_sequence(5), v.add_sequence(5), v.add_sequence(5)
    colours, extent = dict(v._colors), v._extent
    assert v.free(a) and v._colors[b] == colours[b] and v._colors[c] == colours[c]
    d = v.add_sequence(3)
    assert v._colors[d] not in (colours[b], colours[c]) and v._colors[d] in PALETTE
    assert v.append(b, 2) and v._extent == extent  # same pool: same limits, so the same cell size
    plt.close("all")


def test_same_prompt_starts_with_the_previous_sequences_prompt():
    """Issue #29: "same prompt" shared a prefix only when ticked for both sequences."""
    v = BlockTableVisualizer(num_gpu_blocks=24, block_size=4, enable_prefix_caching=True)
    first = v.add_sequence(9)
    second = v.add_sequence(6, reuse_prompt=True)
    assert v.manager.get_token_ids(second) == v.manager.get_token_ids(first)[:6]
    assert v.manager.num_cached_tokens(second) == 4  # its one full block was the first's
    third = v.add_sequence(10, reuse_prompt=True)
    assert v.manager.get_token_ids(third)[:6] == v.manager.get_token_ids(second)


def test_a_large_pool_is_a_wide_grid():
    from pagedkv.viz.block_map import _grid_columns

    assert _grid_columns(24) == 7 and _grid_columns(128) == 16 and _grid_columns(1024) == 46


def test_the_app_culls_idle_kernels():
    """Issue #29: every page load started a ~480 MB kernel that outlived its tab."""
    from pagedkv.__main__ import CULL_IDLE_SECONDS, voila_command

    command = voila_command(8866, open_browser=False)
    assert f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_SECONDS}" in command
    assert "--Voila.ip=127.0.0.1" in command and command[-1] == "--no-browser"


def test_the_app_asks_no_cdn_and_voila_has_nothing_to_warn_about():
    """Issue #46: Voila's lab template fetched Font Awesome from a CDN on every load (the browser test checks that
    no request leaves the machine); tornado warned that the ping timeout (90 s) exceeded the interval (30 s)."""
    import json

    from jupyter_server.base.websocket import WS_PING_INTERVAL

    from pagedkv.__main__ import JUPYTER_FILES, voila_command, voila_environ

    assert "--template=pagedkv" in voila_command(8866, open_browser=False)
    assert voila_environ({"JUPYTER_PATH": "/x"})["JUPYTER_PATH"].split(os.pathsep) == [str(JUPYTER_FILES), "/x"]
    template = (JUPYTER_FILES / "voila" / "templates" / "pagedkv" / "index.html.j2").read_text()
    assert "http" not in template.replace("https://", "").split("-#}")[1]  # nothing fetched from outside
    settings = json.loads((JUPYTER_FILES / "voila.json").read_text())["Voila"]["tornado_settings"]
    assert settings["ws_ping_timeout"] == WS_PING_INTERVAL and settings["disable_check_xsrf"] is True


def test_a_block_map_has_a_key_only_when_asked():
    m = BlockSpaceManager(4, 8)
    m.allocate("A", range(5))
    plain = draw_block_map(m.snapshot(), highlight=[0])
    assert not plain.figure.legends
    keyed = draw_block_map(m.snapshot(), highlight=[0], key=True)
    labels = [t.get_text() for t in keyed.figure.legends[0].get_texts()]
    assert "free block" in labels and any("red outline" in label for label in labels)
    plt.close("all")


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_visualizers_map_has_a_key_that_covers_nothing(monkeypatch):
    """Issue #38: the main map had no key for #n, xN and the red outline."""
    import pagedkv.viz.visualizer as visualizer

    shown = []
    monkeypatch.setattr(visualizer, "show_figure", lambda output, fig: shown.append(fig))
    v = BlockTableVisualizer(num_gpu_blocks=24, block_size=4)
    v._displayed = True
    v.fork(v.add_sequence(6))
    fig = shown[-1]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(label.startswith("#n:") for label in labels) and any("xN" in label for label in labels)
    assert "red outline: the blocks the last action touched" in labels
    renderer = fig.canvas.get_renderer()
    key = fig.legends[0].get_window_extent(renderer)
    assert not any(_overlaps(key, text.get_window_extent(renderer)) for text in fig.axes[0].texts)
    plt.close("all")


def test_zero_tokens_are_refused_with_a_message():
    """Issue #38: the widgets turned a 0 typed in into 1; the actions refuse it and say why."""
    v = BlockTableVisualizer(num_gpu_blocks=24, block_size=4)
    v.prompt_len.value = 0
    assert v.prompt_len.value == 0  # the widget passes it on
    assert v.add_sequence(v.prompt_len.value) is None and v.seq_ids == []
    assert v.message_is_error and "prompt length" in v.message
    a = v.add_sequence(6)
    v.num_tokens.value = 0
    assert not v.append(a, v.num_tokens.value) and "tokens to append" in v.message
    assert v.manager.get_num_tokens(a) == 6


def test_the_widgets_set_their_drawings_as_output_state_and_never_capture(monkeypatch):
    """Issue #38: capturing into an Output widget (``with output: plt.show()``) while a cell runs under nbclient
    (Voila, nbgrader) made nbclient send a comm_msg on the shell socket that swallowed the cell's reply: the app
    hung now and then. The drawing is the Output widget's state, set at once, with no figure left open."""
    import ipywidgets

    from pagedkv.viz import SchedulerVisualizer

    def capture(output):
        raise AssertionError("an Output widget captured output")

    monkeypatch.setattr(ipywidgets.Output, "__enter__", capture)
    for widget in (BlockTableVisualizer(num_gpu_blocks=24, block_size=4),
                   SchedulerVisualizer(version="v1", sliding_window=8, num_requests=3),
                   SchedulerVisualizer(num_requests=3)):
        widget._displayed = True
        widget.refresh()
        (output,) = widget.output.outputs
        assert output["output_type"] == "display_data" and output["data"]["image/png"].startswith("iVBORw0KGgo")
        assert plt.get_fignums() == []  # closed: the notebook shows no second copy under the cell
    widget.step()
    assert widget.output.outputs[0]["data"]["image/png"] != output["data"]["image/png"]


def hybrid_snapshot(retention):
    """Notebook 12 section 3's request (window 8, block size 4, a 14-token prompt) after 20 tokens."""
    from pagedkv.v1 import FullAttentionSpec, KVCacheManager, Request, SlidingWindowSpec, get_kv_cache_groups

    specs = [SlidingWindowSpec(4, 1, 2, sliding_window=8), FullAttentionSpec(4, 1, 2)]
    kv = KVCacheManager(4, 24, True, get_kv_cache_groups(specs), prefix_cache_retention_interval=retention)
    request = Request("A", list(range(14)), max_tokens=8)
    kv.allocate_slots(request, 14)
    request.num_computed_tokens = 14
    for token in range(6):
        request.output_token_ids.append(token)
        kv.allocate_slots(request, 1)
        request.num_computed_tokens += 1
    return kv.snapshot()


@pytest.mark.parametrize("retention, sliding_row, hatched", [
    # 0.33: only entries 1, 2 (blocks 2, 3, before the replay boundary 12) were named; they left the window for the
    # free queue's tail, while entry 0 (block 1), unnamed, went to its head and came back as entry 4
    (0, "[null, null, null, 4, 1]", {1, 4}),
    (None, "[null, null, null, 4*, 9*]", set()),  # dense: every full block named
])
def test_named_and_unnamed_sliding_blocks_are_told_apart(retention, sliding_row, hatched):
    state = hybrid_snapshot(retention)
    assert state.sliding_blocks(named=False) == hatched
    text = str(state)
    assert f"sliding 8 -> {sliding_row}" in text and "* = named" in text
    assert "*" not in text.split("full      -> ")[1].split("\n")[0]  # full attention: no marks
    ax = draw_block_map(state, key=True)
    legend = [t.get_text() for t in ax.figure.legends[0].get_texts()]
    assert any(label.startswith("hatched: a sliding block with no hash") for label in legend) == bool(hatched)
    if hatched:
        assert len(collection(ax, "unnamed").get_paths()) == 2 * len(hatched)  # pool cell and table entry


def test_a_map_without_caching_or_sliding_groups_hatches_nothing():
    assert not any(c.get_gid() == "unnamed" for c in draw_block_map(BlockSpaceManager(4, 8).snapshot()).collections)


def _hybrid_three_requests():
    """Notebook 13's run: A, then B and C sharing A's first 24 tokens, on the tiny model with two windowed layers."""
    import dataclasses

    from pagedkv import LlamaForCausalLM, LLMEngine, load_tiny

    model, tokenizer = load_tiny()
    config = dataclasses.replace(model.config, sliding_window=8,
                                 layer_types=["sliding_attention", "full_attention"] * 2)
    hybrid = LlamaForCausalLM(config)
    hybrid.load_state_dict(model.state_dict())
    engine = LLMEngine(hybrid, version="v1", num_gpu_blocks=40, block_size=4)
    prompt_a = tokenizer.encode("The list of items in a dict is ordered.")
    prompts = {"A": prompt_a, "B": prompt_a[:24] + tokenizer.encode(" sets"),
               "C": prompt_a[:24] + tokenizer.encode(" keys")}
    engine.generate([prompt_a], 6)
    for name in "BC":
        engine.generate([prompts[name]], 1)
    return engine.kv_cache_manager, prompts


def test_named_strips_show_what_the_pool_names_and_where_the_resume_points_fall():
    from pagedkv.v1 import Request
    from pagedkv.viz.named_strips import NAMED, draw_named_strips, named_strips_text

    kv, prompts = _hybrid_three_requests()

    def named(prompt, group_id):
        hashes = kv.block_hashes(Request("probe", prompt, max_tokens=1), len(prompt))
        return [kv.block_pool.get_cached_block(h, [group_id]) is not None for h in hashes]

    strips = {f"{n} {g}": named(p, gid) for n, p in prompts.items() for gid, g in enumerate(["sliding", "full"])}
    marks = {f"{n} sliding": {"replay": len(p) - 1} for n, p in prompts.items()}
    marks["B sliding"]["junction"] = 24
    # the full group names every block; a sliding group only the 2 blocks (cdiv(8 - 1, 4)) before each resume
    # point: A's replay boundary 38 -> blocks 7, 8; B's junction 24 -> 4, 5 and its replay boundary 28 -> 5, 6
    assert all(strips["A full"]) and all(strips["B full"])
    assert [i for i, on in enumerate(strips["A sliding"]) if on] == [4, 5, 7, 8]  # 4, 5: B's, same hashes
    assert [i for i, on in enumerate(strips["B sliding"]) if on] == [4, 5, 6]
    text = named_strips_text(strips, marks)
    assert "B sliding  ....##|#|   (junction 24, replay 28)" in text
    ax = draw_named_strips(strips, marks, block_size=4)
    filled = [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(NAMED)]
    assert len(filled) == sum(sum(s) for s in strips.values())
    assert [t.get_text() for t in ax.get_yticklabels()] == list(strips)
    assert len(ax.get_legend().get_texts()) == 4


def test_named_strips_refuse_marks_for_unknown_rows():
    from pagedkv.errors import PagedKVValueError
    from pagedkv.viz.named_strips import draw_named_strips

    with pytest.raises(PagedKVValueError, match="marks name"):
        draw_named_strips({"A sliding": [True]}, {"A full": {"replay": 3}})
    with pytest.raises(PagedKVValueError, match="kinds among"):
        draw_named_strips({"A sliding": [True]}, {"A sliding": {"resume": 3}})


def test_a_bare_pool_is_drawn_with_its_ref_counts():
    """Notebook 03 draws a BlockPool alone: blocks in use are grey (no table says whose), each with its count."""
    from pagedkv.v1.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=4, block_size=4, enable_caching=False)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block])
    state = pool.snapshot()
    assert state.tables == {} and state.blocks[block].ref_count == 2 and state.free_block_ids() == [1, 2, 3]
    ax = draw_block_map(state, ref_counts=True, key=True)
    assert "ref 2" in texts(ax) and "x2" not in texts(ax) and "#0" in texts(ax)
    labels = [t.get_text() for t in ax.figure.legends[0].get_texts()]
    assert any(label.startswith("grey: in use") for label in labels) and any("ref N" in label for label in labels)
    assert not any("block table" in label or "stripes" in label for label in labels)  # no tables, no sharing drawn
    pool.free_blocks([block])
    pool.free_blocks([block])
    assert pool.snapshot().free_block_ids() == [0, 1, 2, 3]


def test_the_slot_map_numbers_each_slot_by_the_formula():
    from pagedkv.v1 import KVCacheManager, Request
    from pagedkv.viz import draw_slots, render_slots, slot_mapping

    kv = KVCacheManager(block_size=4, num_gpu_blocks=12, enable_caching=False)
    for name, n in (("A", 6), ("B", 9)):
        kv.allocate_slots(Request(name, list(range(n)), max_tokens=1), n)
    state = kv.snapshot()
    assert slot_mapping(state, "B") == [8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert "logical 1 -> block 1: slots 4-7 hold positions 4-5 (slots 6-7 empty)" in render_slots(state, ["A"])
    ax = draw_slots(state, ["A", "B"])
    assert [str(s) for s in range(20)] == [t for t in texts(ax) if t.isdigit()]  # every slot of the five blocks
    assert "pos 8" in texts(ax) and "pos 9" not in texts(ax) and "B: logical 2 -> block 4" in texts(ax)
    with pytest.raises(ValueError, match="holds no blocks"):
        slot_mapping(state, "C")


def test_a_still_prints_what_only_its_drawing_showed_and_keeps_colours(monkeypatch, capsys):
    """Review 07-s4r4: the notebook's own ``show`` helper (colour bookkeeping, key options) moved here. A still prints
    the text map plus each cached free block's hash and the CPU queue, and a sequence keeps its colour after the
    sequences before it are freed."""
    import IPython.display

    from pagedkv.viz.block_map import PALETTE

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    v = BlockTableVisualizer(block_size=4, num_gpu_blocks=12, num_cpu_blocks=4, enable_prefix_caching=True)
    v.add_sequence(12)
    v.add_sequence(9, reuse_prompt=True)
    v.free("A")
    v.show("after free A", touched="the block that joined the free queue")
    out = capsys.readouterr().out
    name = v.snapshot().blocks[2].block_hash[:8]
    assert "free GPU queue (next first): 4 5 6 7 8 9 10 11 2*" in out
    assert f"evicted when handed out)\n    block 2: hash {name}\n" in out
    assert "11 2*\n  free CPU queue (next first): 0 1 2 3\n" in out
    assert v._colors["B"] == PALETTE[1]  # B's colour from before A was freed, not the first free one
    assert len(shown) == 1 and shown[0].format == "png"


def test_free_queues_side_by_side():
    from pagedkv.errors import PagedKVValueError
    from pagedkv.viz import draw_free_queues, free_queues_text

    rows = {"tail rule": [4, 5, 3, 2], "head rule": [3, 2, 4, 5]}
    assert free_queues_text(rows, {"head rule": {2}}).splitlines() == ["tail rule  4 5 3 2", "head rule  3 2* 4 5"]
    ax = draw_free_queues(rows, {"head rule": {2}}, marked={2, 3})
    assert [t.get_text() for t in ax.texts] == ["4", "5", "3", "2", "3", "2", "4", "5"]
    assert sum(p.get_linewidth() > 2 for p in ax.patches) == 4  # 2 and 3 outlined in both rows
    assert len(ax.get_legend().get_texts()) == 3
    with pytest.raises(PagedKVValueError, match="not among the queues"):
        draw_free_queues(rows, {"other": {2}})


def test_placeholder_slots_show_the_slot_given_to_a_token_nobody_has_seen():
    """Notebook 16's strip, read off AsyncScheduler: after step 1 is scheduled, position 7 (step 0's token) has a slot
    and position 8 (step 1's) has none yet; the marks count num_output_placeholders."""
    from pagedkv.errors import PagedKVValueError
    from pagedkv.v1 import AsyncScheduler, KVCacheManager
    from pagedkv.viz import draw_placeholder_slots, placeholder_slots_text
    from pagedkv.viz.placeholder_slots import PLACEHOLDER

    s = AsyncScheduler(KVCacheManager(block_size=4, num_gpu_blocks=8, enable_caching=False))
    s.add_request("r", [1, 2, 3, 4, 5, 6, 7], 10)
    moments = []
    for when in ("step 0", "step 1"):
        s.schedule()
        r = s.requests["r"]
        moments.append((when, r.num_tokens, r.num_output_placeholders, s.kv_cache_manager.num_slots["r"]))
    assert placeholder_slots_text(moments, 4).splitlines()[:2] == ["step 0  ####|###o", "step 1  ####|###? o"]
    ax = draw_placeholder_slots(moments, 4)
    filled = [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(PLACEHOLDER)]
    assert len(filled) == 1 and [t.get_text() for t in ax.texts] == ["?", "?", "?"]
    assert len(ax.get_legend().get_texts()) == 4
    with pytest.raises(PagedKVValueError, match="known tokens but"):
        placeholder_slots_text([("sync, after an update", 8, 0, 7)], 4)


def _tight_pool_run():
    """Today's scheduler over a pool too small for two requests, recorded as notebook 12 records it: each step's
    tables, the requests preempted in it and those admitted again (with their prefix-cache tokens)."""
    from pagedkv.v1 import KVCacheManager, Scheduler

    s = Scheduler(KVCacheManager(block_size=4, num_gpu_blocks=5))
    s.add_request("A", [1, 2, 3, 4, 5, 6], 8)
    s.add_request("B", [7, 8, 9, 10, 11], 8)
    tables, preempted, back, gone = [], {}, {}, set()
    while s.has_requests():
        out = s.schedule()
        step = len(tables)
        if out.preempted_req_ids:
            preempted[step] = list(out.preempted_req_ids)
            gone.update(out.preempted_req_ids)
        if returned := {r: s.requests[r].num_cached_tokens for r in out.scheduled_new_reqs if r in gone}:
            back[step] = returned
        s.update_from_output(out, {r: 5 for r in s.sampling_request_ids(out)})
        tables.append({r: list(t) for r, t in s.kv_cache_manager.snapshot().tables.items()})
    return tables, preempted, back


def test_blocks_held_marks_each_preemption_and_comeback_of_a_tight_pool():
    """Notebook 12's band chart, read off today's scheduler in a pool too small for two requests: the newest is
    preempted (its band stops, its blocks freed) and comes back with its whole table, its first block from the
    prefix cache."""
    from pagedkv.errors import PagedKVValueError
    from pagedkv.viz import blocks_held_text, draw_blocks_held

    tables, preempted, back = _tight_pool_run()
    assert list(preempted.values()) == [["B"]] and [list(b) for b in back.values()] == [["B"]]
    lines = blocks_held_text(tables, preempted, back).splitlines()
    (p_step,), (b_step,) = preempted, back
    assert lines[1].split()[:4] == [str(p_step), "B", "preempted", str(len(tables[p_step - 1]["B"]))]
    assert lines[2].split()[:4] == [str(b_step), "B", "back", str(len(tables[b_step]["B"]))]
    assert lines[2].split()[-1] == str(back[b_step]["B"]) == "4"  # B's first full block, still named
    ax = draw_blocks_held(tables, preempted, back, pool=5)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["B", "A"]  # the first request on top
    assert [line.get_marker() for line in ax.lines] == ["x", "^"] and [t.get_text() for t in ax.texts] == ["4"]
    assert len(ax.get_legend().get_texts()) == 4
    plt.close("all")
    with pytest.raises(PagedKVValueError, match="step numbers of the run"):
        blocks_held_text(tables, {len(tables): ["B"]})


def test_worker_rows_send_new_ids_and_a_comeback_its_whole_table():
    """Notebook 12's worker-side picture, read off today's scheduler in a pool too small for two requests: a running
    request's row gains only the ids it was just given; the victim's row is dropped, and when it comes back its whole
    table is sent, the block the prefix cache gave back marked. The rows rebuilt from what was sent are the
    scheduler's tables."""
    from pagedkv.errors import PagedKVValueError
    from pagedkv.viz import draw_worker_rows, rows_after, worker_rows_text

    tables, preempted, back = _tight_pool_run()
    worker = {}  # the worker's rows, built from nothing but what each step sends
    for step in range(len(tables)):
        for request_id, row in rows_after(tables, step, preempted).items():
            if isinstance(row, str):
                worker.pop(request_id)
            else:
                kept, sent = row
                assert worker.get(request_id, []) == kept
                worker[request_id] = kept + sent
        assert worker == tables[step]
    (p_step,), (b_step,) = preempted, back
    assert rows_after(tables, p_step, preempted)["B"] == "dropped"
    assert rows_after(tables, b_step, preempted)["B"] == ([], tables[b_step]["B"])  # the whole table, sent again
    grown = next(st for st in range(1, p_step) if len(tables[st]["A"]) > len(tables[st - 1]["A"]))
    assert rows_after(tables, grown)["A"] == (tables[grown - 1]["A"], tables[grown]["A"][-1:])  # one new id
    lines = worker_rows_text(tables, (0, p_step, b_step), preempted, back, block_size=4).splitlines()
    row_b = lines[[line.split()[0] for line in lines].index("B")].split()
    assert row_b[1] == "+" + str(tables[0]["B"][0]) and "dropped" in row_b
    assert row_b[-len(tables[b_step]["B"])] == f"+{tables[b_step]['B'][0]}*"  # its first block from the cache
    fig = draw_worker_rows(tables, (0, p_step, b_step), preempted, back, block_size=4)
    scheduler, worker_side = fig.axes
    assert [t.get_text() for t in worker_side.get_yticklabels()] == ["A", "B"]
    assert "row dropped" in [t.get_text() for t in worker_side.texts]
    assert [p.get_hatch() for p in scheduler.patches].count("///") == 1
    assert len(fig.legends[0].get_texts()) == 3
    plt.close("all")
    with pytest.raises(PagedKVValueError, match="pass block_size"):
        worker_rows_text(tables, (b_step,), preempted, back)
    with pytest.raises(PagedKVValueError, match="step numbers of the run"):
        draw_worker_rows(tables, (len(tables),))
