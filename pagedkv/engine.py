"""Layer 12 — ``LLMEngine``: a scheduler, a model and a paged KV cache for every layer, one step at a time.

vLLM splits this between ``vllm/engine/llm_engine.py`` (``step``),
``vllm/worker/model_runner.py`` (the flat batch and its attention metadata) and
``vllm/worker/cache_engine.py`` (the per-layer K/V tensors); nano-vllm between
``engine/llm_engine.py`` and ``engine/model_runner.py``.  One step:

    schedule  ->  move blocks (swap out, swap in, copy-on-write)  ->  run the model  ->  sample  ->  update

The model sees one flat batch of new tokens (each prefill's uncached tokens,
one token per decode) with their positions, and a :class:`PagedKVStore` that
its attention layers call: it writes the new K/V through the slot mapping,
then attends causally over a prefill's blocks, or runs ``paged_attention`` for
the decodes.  Every layer has its own K/V tensors; all share the one block
table per request, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import CacheEngine, reshape_and_cache
from .errors import PagedKVValueError, UnknownSequenceError
from .kernels import check_attention_args, gather_kv, run_paged_attention
from .kernels.validate import BACKENDS
from .manager import BlockSpaceManager
from .model import LlamaForCausalLM, causal_attention
from .sampling import BeamSearchParams, CompletionOutput, RequestOutput, SamplingParams, sample
from .scheduler import Scheduler, SchedulerOutputs
from .validate import check_choice, check_int, is_list_like


@dataclass
class EngineStats:
    num_preemptions: int = 0  # recompute and swap alike
    num_prefix_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    peak_gpu_blocks: int = 0  # the most GPU blocks in use after any step's scheduling
    steps: int = 0
    num_computed_tokens: int = 0  # tokens the model ran on (prefill and decode)


@dataclass
class _Sampling:
    """A request's sampling state: its params, its own generator (None: greedy), its running log-probability."""

    params: SamplingParams
    generator: torch.Generator | None
    stop_token_ids: frozenset
    prompt_token_ids: list
    cumulative_logprob: float = 0.0


@dataclass
class _Prefill:
    rows: slice  # this request's rows in the flat batch
    block_table: torch.Tensor
    context_len: int  # tokens it attends over once this step's are written
    num_past: int  # tokens before its first new one


@dataclass
class PagedKVStore:
    """What ``LlamaAttention`` calls in a paged step: ``attend(layer, q, k, v)`` for the flat batch."""

    caches: list  # one CacheEngine per layer
    slot_mapping: torch.Tensor  # where each new token's K/V goes (-1: already in the prefix cache)
    prefills: list  # one _Prefill per prefilling request
    decode_rows: slice  # the decodes' rows, one each, at the end of the batch
    block_tables: torch.Tensor  # the decodes', int32, padded
    seq_lens: torch.Tensor  # the decodes', int32
    backend: str

    def __post_init__(self):
        """What every layer reuses: the rows to write and their slots, and (after layer 0) the decode shape."""
        keep = self.slot_mapping >= 0
        self._rows = None if bool(keep.all()) else keep
        self._slots = self.slot_mapping[keep]
        self._shape = None  # the decodes' sizes, checked by the first layer (vLLM: attention metadata)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = self.caches[layer]
        new_kv = (k, v) if self._rows is None else (k[self._rows], v[self._rows])
        reshape_and_cache(cache.key_cache, cache.value_cache, self._slots, *new_kv)
        out = torch.empty_like(q)
        for p in self.prefills:  # the cached prefix blocks + the tokens just written, causally
            keys, values = gather_kv(cache.key_cache, cache.value_cache, p.block_table, p.context_len)
            out[p.rows] = causal_attention(q[p.rows], keys, values, p.num_past)
        if self.decode_rows.stop > self.decode_rows.start:  # one query each, over its pages, in place
            query = q[self.decode_rows]
            if self._shape is None:
                self._shape = check_attention_args(query, cache.key_cache, cache.value_cache, self.block_tables,
                                                   self.seq_lens, backend=self.backend)
            out[self.decode_rows] = run_paged_attention(query, cache.key_cache, cache.value_cache, self.block_tables,
                                                        self.seq_lens, self._shape, self.backend)
        return out


class LLMEngine:
    """Serve many requests at once through one paged KV cache; greedy decoding or seeded sampling."""

    def __init__(self, model: LlamaForCausalLM, *, num_gpu_blocks: int, block_size: int = 16,
                 num_cpu_blocks: int = 0, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 preemption_mode="recompute", enable_prefix_caching: bool = False, watermark: float = 0.01,
                 backend: str = "auto"):
        if not isinstance(model, LlamaForCausalLM):
            raise PagedKVValueError(f"model must be a pagedkv.model.LlamaForCausalLM, got {type(model).__name__}; "
                                    "load one with LlamaForCausalLM.from_pretrained(dir) or load_tiny().")
        check_choice("backend", backend, BACKENDS)
        config = model.config
        self.model = model.eval()
        self.backend = backend
        self.block_manager = BlockSpaceManager(check_int("block_size", block_size, minimum=1),
                                               check_int("num_gpu_blocks", num_gpu_blocks, minimum=1),
                                               check_int("num_cpu_blocks", num_cpu_blocks, minimum=0),
                                               watermark, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens, preemption_mode)
        dtype = next(model.parameters()).dtype
        self.caches = [CacheEngine(num_gpu_blocks, block_size, config.num_key_value_heads, config.head_dim,
                                   num_cpu_blocks, dtype) for _ in range(config.num_hidden_layers)]
        self.stats = EngineStats()
        self._num_generated = 0
        self._sampling: dict = {}  # request_id -> _Sampling, until pop_finished() hands the output over

    # ------------------------------------------------------------ requests
    def add_request(self, request_id, prompt_token_ids, params=None, *, max_tokens: int | None = None,
                    ignore_eos: bool = False) -> None:
        """Queue a request. ``params``: an int (greedy, at most that many tokens; EOS ends it unless
        ``ignore_eos``; ``max_tokens=`` says the same) or a :class:`SamplingParams` with ``n=1`` (seeded
        sampling: the same tokens as ``generate_dense`` whatever the batch, pool or preemption). It ends after
        ``max_tokens`` tokens, the model's EOS or a stop token."""
        params = self._sampling_params(params, max_tokens, ignore_eos)
        stop = self.model.stop_token_ids(params.ignore_eos) | frozenset(params.stop_token_ids)
        prompt = self.model.check_prompt("prompt_token_ids", prompt_token_ids)
        self.scheduler.add_request(request_id, prompt, params.max_tokens, stop)
        generator = None if params.greedy else params.generators()[0]
        self._sampling[request_id] = _Sampling(params, generator, stop, prompt)

    def _sampling_params(self, params, max_tokens, ignore_eos: bool) -> SamplingParams:
        """``params`` checked (stop ids inside the vocabulary); an int becomes greedy ``SamplingParams``."""
        if (params is None) == (max_tokens is None):
            raise PagedKVValueError("pass params (an int max_tokens or a SamplingParams) or max_tokens=, not both "
                                    f"or neither (got params={params!r}, max_tokens={max_tokens!r}).")
        params = max_tokens if params is None else params
        if isinstance(params, BeamSearchParams) or (isinstance(params, SamplingParams) and params.n > 1):
            raise PagedKVValueError(f"{params!r} asks for several sequences per request (a sequence group), which "
                                    "this engine does not serve yet; generate_dense and beam_search_dense give "
                                    "the same outputs with a contiguous cache, or add n requests with seeds.")
        if not isinstance(params, SamplingParams):
            params = SamplingParams(temperature=0, max_tokens=check_int("max_tokens", params, minimum=1),
                                    ignore_eos=ignore_eos)
        self.model.check_token_ids("stop_token_ids", params.stop_token_ids)
        return params

    def pop_finished(self, request_id) -> RequestOutput:
        """A finished request's :class:`RequestOutput` (its tokens, log-probability and why it stopped), once."""
        if request_id not in self.scheduler.finished:
            raise UnknownSequenceError(f"request {request_id!r} has not finished (or was popped already); step() "
                                       "until it leaves scheduler.requests.")
        tokens, state = self.scheduler.finished.pop(request_id), self._sampling.pop(request_id)
        reason = "stop" if tokens and tokens[-1] in state.stop_token_ids else "length"
        completion = CompletionOutput(0, tokens, state.cumulative_logprob, reason)
        return RequestOutput(request_id, state.prompt_token_ids, [completion])

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def generate(self, prompts: list[list[int]], params=None, *, max_tokens: int | None = None,
                 ignore_eos: bool = False):
        """Every prompt's continuation, in order, equal to ``generate_dense`` for each prompt alone.

        ``params`` an int: greedy, returns ``list[list[int]]``; a ``SamplingParams``: ``list[RequestOutput]``.
        """
        if not (is_list_like(prompts) or is_list_like(prompts, ndim=2)):
            raise PagedKVValueError("prompts must be a list of token-id lists, e.g. [tokenizer.encode('The ')].")
        prompts = [self.model.check_prompt(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        sampling = self._sampling_params(params, max_tokens, ignore_eos)  # all checked before anything is added
        request_ids = []
        for prompt in prompts:
            request_ids.append(("generate", self._num_generated))
            self._num_generated += 1
            self.add_request(request_ids[-1], prompt, sampling)
        while any(r in self.scheduler.requests for r in request_ids):
            self.step()
        outputs = [self.pop_finished(r) for r in request_ids]
        if isinstance(params, SamplingParams):
            return outputs
        return [o.outputs[0].token_ids for o in outputs]

    # ------------------------------------------------------------ one step
    def step(self) -> SchedulerOutputs:
        """Schedule, move blocks, run the model on the batch, sample greedily, update the scheduler."""
        out = self.scheduler.schedule()
        self._count(out)
        self._move_blocks(out)
        next_tokens = self._run_model(out) if not out.is_empty else {}
        self.scheduler.update(out, next_tokens)
        return out

    def _move_blocks(self, out: SchedulerOutputs) -> None:
        """The copies the scheduler asked for, before the model writes anything (vLLM: ``cache_engine``)."""
        for cache in self.caches:
            cache.swap("gpu", "cpu", out.blocks_to_swap_out)
            cache.swap("cpu", "gpu", out.blocks_to_swap_in)
            cache.copy_blocks(out.blocks_to_copy)

    @torch.inference_mode()
    def _run_model(self, out: SchedulerOutputs) -> dict:
        manager, block_size = self.block_manager, self.block_manager.block_size
        input_ids, positions, slots, last_rows, prefills = [], [], [], [], []

        def slot(table, pos):
            return table[pos // block_size] * block_size + pos % block_size

        for request_id, tokens in out.prefills:
            num_cached = manager.num_cached_tokens(request_id)
            start = min(num_cached, len(tokens) - 1)  # a fully cached prompt still runs its last token
            table = manager.get_block_table(request_id)
            rows = slice(len(input_ids), len(input_ids) + len(tokens) - start)
            input_ids += tokens[start:]
            positions += range(start, len(tokens))
            slots += [slot(table, p) if p >= num_cached else -1 for p in range(start, len(tokens))]
            prefills.append(_Prefill(rows, torch.tensor(table, dtype=torch.int32), len(tokens), start))
            last_rows.append(rows.stop - 1)
        decode_start = len(input_ids)
        tables, seq_lens = [], []
        for request_id in out.decodes:
            table, num_tokens = manager.get_block_table(request_id), manager.get_num_tokens(request_id)
            input_ids.append(self.scheduler.requests[request_id].output_token_ids[-1])
            positions.append(num_tokens - 1)
            slots.append(slot(table, num_tokens - 1))
            tables.append(table)
            seq_lens.append(num_tokens)
            last_rows.append(len(input_ids) - 1)
        store = PagedKVStore(self.caches, torch.tensor(slots), prefills, slice(decode_start, len(input_ids)),
                             _pad(tables), torch.tensor(seq_lens, dtype=torch.int32), self.backend)
        logits = self.model.last_logits(torch.tensor(input_ids), torch.tensor(positions), store, last_rows)
        self.stats.num_computed_tokens += len(input_ids)
        return self._sample(out.scheduled, logits)

    def _sample(self, request_ids: list, logits: torch.Tensor) -> dict:
        """One token per row: each request with its own params and generator (vLLM: the ``Sampler``)."""
        states = [self._sampling[r] for r in request_ids]
        if all(s.generator is None for s in states):  # all greedy: one argmax for the batch
            tokens = logits.argmax(dim=-1).tolist()
        else:
            tokens = [sample(row, s.params, s.generator) for row, s in zip(logits, states)]
        chosen = torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(tokens)), tokens].tolist()
        for state, lp in zip(states, chosen):
            state.cumulative_logprob += lp
        return dict(zip(request_ids, tokens))

    def _count(self, out: SchedulerOutputs) -> None:
        """Statistics of a step just scheduled: blocks in use now, prefix hits of its prefills."""
        manager = self.block_manager
        self.stats.steps += 1
        self.stats.num_preemptions = self.scheduler.num_preemptions
        self.stats.num_prefix_cached_tokens += sum(manager.num_cached_tokens(r) for r, _ in out.prefills)
        in_use = manager.num_total_gpu_blocks - manager.num_free_gpu_blocks
        self.stats.peak_gpu_blocks = max(self.stats.peak_gpu_blocks, in_use)

    def __repr__(self) -> str:
        return (f"LLMEngine(num_gpu_blocks={self.block_manager.num_total_gpu_blocks}, "
                f"block_size={self.block_manager.block_size}, {self.scheduler!r})")


def _pad(tables: list[list[int]]) -> torch.Tensor:
    """Block tables as one int32 tensor, padded with 0 (entries past seq_len are never read)."""
    width = max((len(t) for t in tables), default=1)
    padded = torch.zeros((len(tables), width), dtype=torch.int32)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
    return padded
