"""Layer 3 — prefix caching: naming full blocks by their content.

A full block is named by a hash of *(the previous block's hash, this block's
token ids)*.  Chaining the parent's hash in means two blocks get the same name
only if everything before them is the same too, which is what makes reusing a
block's K/V correct: attention at a position depends on every earlier token.

This mirrors vLLM v1 (``hash_block_tokens`` in ``vllm/v1/core/kv_cache_utils.py``
and the ``cached_block_hash_to_block`` map in ``vllm/v1/core/block_pool.py``)
and nano-vllm's ``BlockManager.compute_hash``.  The hash is sha256, never
Python's ``hash()``, whose value changes from process to process.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from .errors import PagedKVValueError


def hash_block_tokens(parent_hash: str | None, token_ids) -> str:
    """sha256 hex digest of the parent block's hash and this block's token ids."""
    digest = hashlib.sha256((parent_hash or "").encode())
    try:
        digest.update(array("q", token_ids).tobytes())
    except (TypeError, OverflowError):
        raise PagedKVValueError(f"token ids must be integers that fit in int64, got {list(token_ids)!r}.") from None
    return digest.hexdigest()


@dataclass
class PrefixCacheStats:
    """Counted in blocks: a hit is a full prompt block served from the cache."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0

    def as_dict(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "hit_rate": self.hit_rate}


class PrefixCache:
    """The hash -> block map, with the content each name stands for.

    Every named block also keeps ``(parent_hash, token_ids)``, and a lookup
    compares them: a hash collision can then never hand one prompt another
    prompt's K/V (it just counts as a miss).

    ``duplicates=False`` (v0, ``pagedkv.manager``): a name belongs to one block;
    a second block filling with the same content stays nameless.
    ``duplicates=True`` (vLLM today, ``pagedkv.v1``): that block is named too,
    as vLLM 0.33's ``BlockHashToBlockMap`` in ``vllm/v1/core/block_pool.py``
    does ("NOTE #1: We currently don't de-duplicate the blocks", so block
    tables stay append-only). A lookup returns the first of the name's blocks
    still cached (``get_cached_block``), and the content stays cached until its
    last copy is evicted (``_maybe_evict_cached_block``).
    """

    def __init__(self, duplicates: bool = False):
        self.duplicates = duplicates
        self.hash_to_blocks: dict[str, list[int]] = {}  # every block with that name, first cached first
        self.block_to_hash: dict[int, str] = {}
        self._content: dict[int, tuple] = {}
        self.stats = PrefixCacheStats()

    @property
    def hash_to_block(self) -> dict[str, int]:
        """Each name and the block a lookup of it returns."""
        return {block_hash: blocks[0] for block_hash, blocks in self.hash_to_blocks.items()}

    def lookup(self, block_hash: str, parent_hash: str | None, token_ids) -> int | None:
        """The (first) block named ``block_hash`` if its content really matches, else None."""
        blocks = self.hash_to_blocks.get(block_hash)
        if not blocks or self._content[blocks[0]] != (parent_hash, tuple(token_ids)):
            return None
        return blocks[0]

    def insert(self, block_id: int, block_hash: str, parent_hash: str | None, token_ids) -> bool:
        """Name ``block_id``. A block keeps the name it has; a name already held by another block stays with
        that one, and with ``duplicates`` names this block too."""
        if block_id in self.block_to_hash or (block_hash in self.hash_to_blocks and not self.duplicates):
            return False
        self.hash_to_blocks.setdefault(block_hash, []).append(block_id)
        self.block_to_hash[block_id] = block_hash
        self._content[block_id] = (parent_hash, tuple(token_ids))
        return True

    def evict(self, block_id: int) -> bool:
        """Forget ``block_id``'s name because the block is about to hold new tokens (other blocks of the same
        name keep it)."""
        block_hash = self.block_to_hash.pop(block_id, None)
        if block_hash is None:
            return False
        blocks = self.hash_to_blocks[block_hash]
        blocks.remove(block_id)
        if not blocks:
            del self.hash_to_blocks[block_hash]
        del self._content[block_id]
        self.stats.evictions += 1
        return True

    def content(self, block_id: int) -> tuple | None:
        """``(parent_hash, token_ids)`` that a named block holds, or None."""
        return self._content.get(block_id)
