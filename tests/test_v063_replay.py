"""pagedkv.labs.v063_replay: vLLM 0.6.3's ``_schedule_default`` on block manager v2, and notebook 09's E3 on it.

The rules pinned here, from 0.6.3's source (vllm/core/...):
* a running request's next token needs one free block for every block its append touches, which for one token is
  always one, even when the token fits in its own last block (block_manager_v2.py ``can_append_slots``, "worst-case
  heuristic"; block/block_table.py ``get_num_blocks_touched_by_append_slots``); no watermark there;
* when that fails, the tail of the unprocessed running queue is preempted, or the request itself
  (scheduler.py ``_schedule_running``: ``running_queue.pop()``, ``victim_seq_group = seq_group``);
* swap-in asks for the request's full blocks plus the blocks its newest token touches, less the watermark
  (``can_swap_in`` -> ``_can_swap``), from the head of ``swapped``, which is in the order requests left, and only in
  a step that preempted nobody (``_schedule_default``);
* prompts are admitted only while nobody is swapped out, and a step that admits one decodes nobody.
"""

from pagedkv.labs import exercises
from pagedkv.labs.v063_replay import Replay063, _Request
from pagedkv.manager import BlockSpaceManager
from pagedkv.scheduler import Scheduler


def section5(exact_append=False):
    replay = Replay063(block_size=2, num_gpu_blocks=6, num_cpu_blocks=8, watermark=0.0, preemption_mode="swap",
                       max_num_seqs=4, max_num_batched_tokens=16, exact_append=exact_append)
    for name in ("r0", "r1", "r2"):
        replay.add_request(name, prompt_len=2, max_tokens=6)
    return replay.run()


def events(steps, what):
    return [(i, name) for i, step in enumerate(steps) for name in getattr(step, what)]


def test_e3_answer_is_063s_worst_case_run():
    steps = section5()
    # step 2: no block free; r0's token fits in its own last block, yet it needs a free one: r2 leaves
    assert steps[1].free_gpu_blocks == 0 and steps[2].swapped_out == ["r2"]
    assert events(steps, "swapped_out") == [(2, "r2"), (4, "r1"), (7, "r1")]
    assert events(steps, "swapped_in") == [(5, "r2"), (6, "r1"), (9, "r1")]  # first out, first in
    assert events(steps, "finished") == [(5, "r0"), (8, "r2"), (9, "r1")]
    assert exercises._v0_swap_back_steps() == (5, 6)
    assert exercises.EXERCISES["v0-swap-back-steps"].expected() == (5, 6)


def test_exact_append_gives_pagedkvs_swap_outs():
    """With pagedkv's exact count in place of the worst case, the replay swaps out when pagedkv's own scheduler
    does (steps 3 and 5), and 0.6.3's first-out, first-in order brings r2 back at 6 and r1 at 9."""
    steps = section5(exact_append=True)
    manager = BlockSpaceManager(block_size=2, num_gpu_blocks=6, num_cpu_blocks=8, watermark=0.0)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=16, preemption_mode="swap")
    for name in ("r0", "r1", "r2"):
        scheduler.add_request(name, [7, 7], max_tokens=6)
    outs, step = [], 0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        outs += [(step, r) for r in out.swapped_out]
        scheduler.update(out, {r: 1 for r in out.scheduled})
        step += 1
    assert events(steps, "swapped_out") == outs == [(3, "r2"), (5, "r1")]
    assert events(steps, "swapped_in") == [(6, "r2"), (9, "r1")]


def test_a_token_that_fits_still_needs_a_free_block():
    replay = Replay063(block_size=4, num_gpu_blocks=1, watermark=0.0, preemption_mode="swap", num_cpu_blocks=4)
    replay.add_request("a", prompt_len=2, max_tokens=3)  # 3 tokens in one block of 4: room for the next
    steps = replay.run(max_steps=2)
    assert steps[0].prefills == ["a"] and steps[0].free_gpu_blocks == 0
    assert steps[1].swapped_out == ["a"] and steps[1].decodes == []  # its own victim
    exact = Replay063(block_size=4, num_gpu_blocks=1, watermark=0.0, exact_append=True)
    exact.add_request("a", prompt_len=2, max_tokens=3)
    assert [s.decodes for s in exact.run()] == [[], ["a"], ["a"]]


def test_swap_in_counts_full_blocks_and_the_newest_tokens_block():
    replay = Replay063(block_size=2, num_gpu_blocks=8, num_cpu_blocks=8, watermark=0.0)
    partial = replay._touched_by_append, replay._num_full_blocks
    half = _Request("h", num_tokens=6, max_tokens=9, num_full_slots=5, num_blocks=3)  # last block has room
    full = _Request("f", num_tokens=7, max_tokens=9, num_full_slots=6, num_blocks=3)  # last block full
    assert [t(half) for t in partial] == [1, 2] and [t(full) for t in partial] == [1, 3]


def test_recompute_is_the_default_for_one_sequence_and_goes_to_the_front():
    replay = Replay063(block_size=2, num_gpu_blocks=6, watermark=0.0, max_num_seqs=4, max_num_batched_tokens=16)
    for name in ("r0", "r1", "r2"):
        replay.add_request(name, prompt_len=2, max_tokens=6)
    steps = replay.run()
    assert not events(steps, "swapped_out")
    assert events(steps, "preempted") == [(2, "r2"), (4, "r2"), (5, "r1"), (7, "r1")]
    assert steps[3].prefills == ["r2"] and steps[3].decodes == []  # nobody swapped: a prompt-only step
    assert steps[6].prefills == ["r1"]  # extendleft: the latest victim is at the head of waiting, before r2
