"""Slot maps for speculative decoding: which slots of a request's blocks hold verified K/V, drafts, rejected drafts.

Drawn from a ``ManagerState`` snapshot (the request's block table, the slots written so far in ``seq_lens``, the
blocks' hashes) and the request's two counters, ``num_computed_tokens`` and ``num_tokens``: plain numbers, so a
map can be drawn for vLLM's own scheduler state as well. Two moments of a step:

* **as scheduled** (``scheduled_drafts=k``): the slots this step writes, the request's new token(s) and its ``k``
  drafts, after its K/V in the cache;
* **after the step** (``scheduled_drafts=None``): the rejected drafts' slots, written but past
  ``num_computed_tokens`` after the rollback: stale, overwritten by the next step before any row reads them. The
  first of them is also the **pending** token's slot (the token the step sampled in place of the first rejected
  draft, below ``num_tokens``): marked, since its K/V is written there next step.

Each block is a row of ``block_size`` slots, numbered by position; a block in the prefix cache shows its hash: never
one with a draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from ..errors import PagedKVValueError
from ..state import ManagerState
from .block_map import EDGE, _lighter

# kind -> (text character, colour, key label)
SLOT_KINDS = {
    "kv": ("#", "#0072B2", "K/V in the cache (verified tokens)"),
    "new": ("n", "#56B4E9", "a sampled token: its K/V is written this step (or the next)"),
    "draft": ("d", "#E69F00", "a draft token: K/V written this step, verified in this forward"),
    "rejected": ("x", "#D55E00", "a rejected draft's slot: stale K/V, past num_computed_tokens"),
    "empty": (".", "#F4F4F4", "empty slot"),
}
PENDING = "a sampled token's position, over a rejected draft's K/V: written next step"


@dataclass(frozen=True)
class SlotMap:
    """One request's blocks, slot by slot: ``kinds[i]`` is a list of ``block_size`` kinds for ``table[i]``."""

    request_id: object
    table: tuple
    kinds: tuple
    hashes: tuple  # the hash of each block (None: not in the prefix cache)
    title: str = ""
    pending: tuple = ()  # positions of sampled tokens whose slot still holds a rejected draft's K/V

    def render(self) -> str:
        """A text map: one line per block (its id, a character per slot, its hash if it is cached), then the key."""
        lines = [self.title] if self.title else []
        for block_id, kinds, block_hash in zip(self.table, self.kinds, self.hashes):
            slots = "".join(SLOT_KINDS[k][0] for k in kinds)
            lines.append(f"  block {block_id:>3}  [{slots}]" + (f"  hash {block_hash[:8]}" if block_hash else ""))
        used = sorted({k for kinds in self.kinds for k in kinds}, key=list(SLOT_KINDS).index)
        lines.append("  " + "   ".join(f"{SLOT_KINDS[k][0]} {k}" for k in used))
        if self.pending:
            lines.append(f"  pending: slot {', '.join(map(str, self.pending))} ({PENDING})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def count(self, kind: str) -> int:
        return sum(k == kind for kinds in self.kinds for k in kinds)


def slot_map(state: ManagerState, request_id, num_computed_tokens: int, num_tokens: int,
             scheduled_drafts: int | None = None, title: str = "") -> SlotMap:
    """The kinds of the request's slots. ``scheduled_drafts``: the step as scheduled, with that many drafts
    (``num_computed_tokens`` as before the step); None: between steps, after the rollback."""
    if request_id not in state.tables:
        raise PagedKVValueError(f"request {request_id!r} holds no blocks in this snapshot; running ones: "
                                f"{list(state.tables)[:8]}.")
    table, bs = state.tables[request_id], state.block_size
    written = state.seq_lens[request_id]  # slots written once this step runs (or the last step ran)
    hashes = {b.block_id: b.block_hash for b in state.blocks if b.device == "gpu"}

    def kind(p: int) -> str:
        if p < num_computed_tokens:
            return "kv"
        if scheduled_drafts is not None:  # as scheduled
            if p < num_tokens:
                return "new"
            return "draft" if p < num_tokens + scheduled_drafts else "empty"
        if p < written:  # between steps: written, yet past the computed tokens
            return "rejected"
        return "new" if p < num_tokens else "empty"

    kinds = tuple(tuple(kind(i * bs + j) for j in range(bs)) for i in range(len(table)))
    pending = tuple(p for p in range(num_computed_tokens, num_tokens) if kinds[p // bs][p % bs] == "rejected")
    return SlotMap(request_id, tuple(table), kinds, tuple(hashes.get(b) for b in table), title, pending)


def draw_slot_maps(maps: list, axes=None, key: bool = True):
    """Draw each :class:`SlotMap` as a column of blocks (a row of slots each), side by side; returns the axes."""
    if axes is None:
        _, axes = plt.subplots(1, len(maps), figsize=(3.2 * len(maps), 0.5 * max(len(m.table) for m in maps) + 1.6))
    axes = list(axes) if hasattr(axes, "__iter__") else [axes]
    depth = max(len(m.table) for m in maps)
    for ax, m in zip(axes, maps):
        bs = len(m.kinds[0]) if m.kinds else 1
        for row, (block_id, kinds, block_hash) in enumerate(zip(m.table, m.kinds, m.hashes)):
            for j, k in enumerate(kinds):
                color = SLOT_KINDS[k][1]
                ax.add_patch(plt.Rectangle((j, row), 0.92, 0.86, facecolor=color, edgecolor=EDGE, linewidth=0.5,
                                           hatch="///" if k == "rejected" else None))
                ax.text(j + 0.46, row + 0.45, str(row * bs + j), ha="center", va="center", fontsize=7,
                        color="white" if k in ("kv", "rejected") else "#333333")  # the slot's position
                if row * bs + j in m.pending:
                    ax.add_patch(plt.Rectangle((j + 0.04, row + 0.04), 0.84, 0.78, fill=False,
                                               edgecolor=SLOT_KINDS["new"][1], linewidth=2.2))
            ax.text(-0.2, row + 0.45, f"block {block_id}", ha="right", va="center", fontsize=8)
            if block_hash:
                ax.text(bs + 0.1, row + 0.45, f"hash {block_hash[:8]}", ha="left", va="center", fontsize=7,
                        color="#333333")
        ax.set_xlim(-2.4, bs + 2.6)
        ax.set_ylim(depth + 0.1, -0.3)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(m.title, fontsize=9)
    if key:
        from matplotlib.patches import Patch
        used = [k for k in SLOT_KINDS if any(k in kinds for m in maps for kinds in m.kinds)]
        handles = [Patch(facecolor=SLOT_KINDS[k][1] if k != "empty" else _lighter("#999999", 0.9), edgecolor=EDGE,
                         hatch="///" if k == "rejected" else None, label=SLOT_KINDS[k][2]) for k in used]
        if any(m.pending for m in maps):
            handles.append(Patch(facecolor="none", edgecolor=SLOT_KINDS["new"][1], linewidth=2.2, label=PENDING))
        axes[0].figure.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    return axes
