"""Layer 6 — paged attention: one family of numba.cuda kernels, a numba CPU twin, and the dense torch reference.

Two calls: ``paged_attention`` is one decode step (one query per sequence), the paper's kernel;
``unified_paged_attention`` is a whole step's mixed batch of prefill chunks and decodes in one call, as vLLM 0.33
attends.  Which file teaches what:

* ``cuda.py`` — **the paper's decode kernel** (vLLM's ``paged_attention_v1/v2``, ``csrc/attention``): the
  ``"tree"`` teaching body (a thread per token, shared-memory reductions; what the simulator runs), its **v1**
  (a thread block per head and sequence) and **v2** partitions (flash-decoding) and v2's **reduce** kernel,
  which the unified kernel's split-KV launch reuses; the launcher.  Notebook ``08_paged_attention_kernel``.
* ``cuda_vllm.py`` — vLLM's mapping of the same job, the grouped phases (a warp per page, a thread group per
  key, 8-byte words, a KV head's query heads in one thread block): ``paged_attention``'s ``"vllm"`` and
  ``"vllm-gqa"`` flavours on a GPU, and **the decode tile of the unified kernel** (``grouped_phases``).
* ``cuda_unified.py`` — **today's unified kernel** (vLLM 0.33's ``kernel_unified_attention``): grid (query
  tiles, KV heads, segments), a decode tile (the grouped phases, partitions merged online) and a prefill tile
  (a page staged once for ``BLOCK_M`` rows, a causal/window mask, online softmax), and the 3-D split-KV mode
  with v2's reduce.  Notebook ``11_unified_attention``.
* ``cuda_device.py`` — what they share: constants, word loads, block-wide and thread-group reductions.
* ``cpu.py`` (the numba twin of the decode kernel), ``unified.py`` (the call, its metadata and its CPU path),
  ``reference.py`` (dense torch), ``validate.py`` (checks before any launch); ``static_report.py`` and ``ptx.py``
  compile every kernel for sm_80/sm_90 with no GPU (static estimates, not measurements).

``configure_cuda_mode()`` runs first, before anything here imports
``numba.cuda``, because numba reads ``NUMBA_ENABLE_CUDASIM`` only once.
"""

from __future__ import annotations

from ..errors import PagedKVValueError
from .backend import configure_cuda_mode

CUDA_MODE = configure_cuda_mode(announce=False)  # said at the first CUDA launch (backend.announce_simulator)

from .cpu import paged_attention_cpu  # noqa: E402  (must come after the mode is set)
from .cuda import paged_attention_cuda  # noqa: E402
from .reference import gather_kv, reference_paged_attention, reference_unified_attention  # noqa: E402
from .unified import UnifiedAttentionMetadata, unified_paged_attention  # noqa: E402
from .validate import check_attention_args  # noqa: E402

if CUDA_MODE.simulator:
    from .simfix import make_simulator_shared_arrays_thread_safe  # noqa: E402

    make_simulator_shared_arrays_thread_safe()  # a numba-cuda simulator race; see simfix.py


def resolve_backend(backend: str = "auto") -> str:
    """``"auto"`` is ``"cuda"`` on a real GPU and the CPU path otherwise (``paged_attention``: the numba CPU twin;
    ``unified_paged_attention``: its vectorised torch path)."""
    if backend == "auto":
        return "cpu" if CUDA_MODE.simulator else "cuda"
    return backend


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale=None, *,
                    backend="auto", partition_size=None, flavour=None):
    """One decode step of attention over a paged KV cache.

    ``query [num_seqs, num_heads, head_size]``; caches ``[num_blocks, block_size,
    num_kv_heads, head_size]``; ``block_tables int32 [num_seqs, max_blocks_per_seq]``;
    ``seq_lens int32 [num_seqs]``.  Returns ``[num_seqs, num_heads, head_size]`` in
    the query's dtype.  ``partition_size`` (a multiple of block_size, at most 8192)
    selects the partitioned v2 kernel on the ``"cuda"`` backend, ``0`` forces v1, and
    ``None`` picks as vLLM does.  ``flavour`` (``"cuda"`` only) picks the kernel's thread mapping: ``"tree"``
    (the teaching kernel), ``"vllm"`` (the paper's, a thread block per query head) or ``"vllm-gqa"`` (a thread
    block per KV head); ``None`` picks as the launcher does.  On a GPU the
    kernels run on the tensors' device, on torch's current stream.
    """
    shape = check_attention_args(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                 backend, partition_size)
    return run_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, shape, backend, partition_size,
                               flavour)


def run_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, shape, backend="auto",
                        partition_size=None, flavour=None):
    """``paged_attention`` after its checks, with ``shape`` from ``check_attention_args``.

    For a caller that checks once and launches many times: the engine runs every layer of a step on the same
    block tables, as vLLM builds its attention metadata once per step and every layer reuses it.
    """
    if shape.num_seqs == 0:  # nothing to attend: no launch at all
        return query.new_empty(tuple(query.shape))
    # Attention reads values; autograd history on an input must not reach the kernels (or the caches).
    query, key_cache, value_cache = query.detach(), key_cache.detach(), value_cache.detach()
    backend = resolve_backend(backend)
    if flavour is not None and backend != "cuda":
        raise PagedKVValueError(f"flavour={flavour!r} picks a CUDA kernel's thread mapping; it needs backend='cuda', "
                                f"not {backend!r}.")
    if backend == "torch":
        return reference_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, shape.scale)
    if backend == "cpu":
        tensors = [t.cpu() for t in (query, key_cache, value_cache, block_tables, seq_lens)]
        return paged_attention_cpu(*tensors, shape.scale).to(query.device)
    return paged_attention_cuda(query, key_cache, value_cache, block_tables, seq_lens, shape, CUDA_MODE,
                                partition_size, flavour)


__all__ = ["CUDA_MODE", "paged_attention", "reference_paged_attention", "resolve_backend", "gather_kv",
           "check_attention_args", "run_paged_attention", "unified_paged_attention", "UnifiedAttentionMetadata",
           "reference_unified_attention"]
