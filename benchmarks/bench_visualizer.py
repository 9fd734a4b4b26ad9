"""How long one visualizer action takes to redraw: draw the block map and render it to PNG.

    python benchmarks/bench_visualizer.py

That is what the widget does per click (matplotlib's inline backend renders a
PNG into the Output widget).  Pools of 64 and 256 blocks, 16 sequences with
forks, best of 5.
"""

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from pagedkv import BlockSpaceManager  # noqa: E402
from pagedkv.viz import draw_block_map  # noqa: E402

from _common import best_of, machine  # noqa: E402


def busy_state(num_blocks, block_size=4):
    m = BlockSpaceManager(block_size, num_blocks, num_cpu_blocks=num_blocks // 4)
    per_seq = num_blocks * block_size // 24
    for i in range(12):
        m.allocate(i, range(per_seq))
    for i in range(0, 12, 3):
        m.fork(i, 100 + i)
        m.append_slots(100 + i, [1])
    m.swap_out(1)
    return m.snapshot()


def redraw(state):
    fig, ax = plt.subplots(figsize=(9, 4.5))
    draw_block_map(state, ax=ax, highlight=[0])
    fig.savefig(io.BytesIO(), format="png", dpi=72)  # the inline backend's default resolution
    plt.close(fig)


def main():
    print(f"machine: {machine()}")
    for num_blocks in (64, 256):
        state = busy_state(num_blocks)
        redraw(state)  # warm up fonts and caches
        seconds = best_of(lambda: redraw(state), 5)
        print(f"{num_blocks:>4} blocks, {len(state.tables)} sequences: redraw {seconds * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
