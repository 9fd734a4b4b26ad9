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

import warnings
from dataclasses import dataclass

import torch

from .cache import CacheEngine, reshape_and_cache
from .errors import PagedKVValueError, UnknownSequenceError
from .kernels import check_attention_args, gather_kv, run_paged_attention
from .kernels.validate import BACKENDS
from .manager import BlockSpaceManager
from .model import LlamaForCausalLM, causal_attention
from .output_processor import Beams, Samples
from .sampling import BeamSearchParams, RequestOutput, SamplingParams
from .scheduler import Scheduler, SchedulerOutputs
from .validate import check_choice, check_int, is_list_like


@dataclass
class EngineStats:
    num_preemptions: int = 0  # recompute and swap alike
    num_prefix_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    peak_gpu_blocks: int = 0  # the most GPU blocks in use after any step's scheduling
    steps: int = 0
    num_computed_tokens: int = 0  # tokens the model ran on (prefill and decode)
    num_cow_copies: int = 0  # copy-on-write block copies (a sequence group's first appends into shared blocks)
    num_ignored: int = 0  # requests that could never fit the pool: finished with the tokens they had


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
        self._processors: dict = {}  # request_id -> Samples | Beams, until pop_finished() hands the output over

    # ------------------------------------------------------------ requests
    def add_request(self, request_id, prompt_token_ids, params=None, *, max_tokens: int | None = None,
                    ignore_eos: bool = False) -> None:
        """Queue a request. ``params``: an int (greedy, at most that many tokens; EOS ends it unless
        ``ignore_eos``; ``max_tokens=`` says the same), a :class:`SamplingParams` (``n`` seeded samples: the same
        tokens as ``generate_dense`` whatever the batch, pool or preemption) or a :class:`BeamSearchParams`
        (equal to ``beam_search_dense``). ``n > 1`` and beam search run as a sequence group sharing blocks."""
        params = self._sampling_params(params, max_tokens, ignore_eos)
        prompt = self.model.check_prompt("prompt_token_ids", prompt_token_ids)
        if isinstance(params, BeamSearchParams):  # EOS ends a beam in the processor, not in the scheduler
            self.scheduler.add_request(request_id, prompt, params.max_tokens, num_seqs=params.beam_width)
            self._processors[request_id] = Beams(request_id, prompt, params, self.model.config.eos_token_id)
            return
        stop = self.model.stop_token_ids(params.ignore_eos) | frozenset(params.stop_token_ids)
        self.scheduler.add_request(request_id, prompt, params.max_tokens, stop, num_seqs=params.n)
        self._processors[request_id] = Samples(request_id, prompt, params, stop)

    def _sampling_params(self, params, max_tokens, ignore_eos: bool):
        """``params`` checked (stop ids inside the vocabulary); an int becomes greedy ``SamplingParams``."""
        if (params is None) == (max_tokens is None):
            raise PagedKVValueError("pass params (an int max_tokens, SamplingParams or BeamSearchParams) or "
                                    f"max_tokens=, not both or neither (got params={params!r}, "
                                    f"max_tokens={max_tokens!r}).")
        params = max_tokens if params is None else params
        if isinstance(params, BeamSearchParams):
            return params
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
        return self._processors.pop(request_id).output(self.scheduler.finished.pop(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def generate(self, prompts: list[list[int]], params=None, *, max_tokens: int | None = None,
                 ignore_eos: bool = False):
        """Every prompt's continuation, in order, equal to ``generate_dense`` for each prompt alone.

        ``params`` an int: greedy, returns ``list[list[int]]``; ``SamplingParams`` or ``BeamSearchParams``:
        ``list[RequestOutput]`` (equal to ``generate_dense`` / ``beam_search_dense``).
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
        if isinstance(params, (SamplingParams, BeamSearchParams)):
            return outputs
        return [o.outputs[0].token_ids for o in outputs]

    # ------------------------------------------------------------ one step
    def step(self) -> SchedulerOutputs:
        """Schedule, move blocks, run the model on the batch, sample, update the scheduler."""
        out = self.scheduler.schedule()
        self._count(out)
        for request_id in out.ignored:
            self._warn_ignored(request_id)
        self._move_blocks(out)
        next_tokens = self._run_model(out) if not out.is_empty else {}
        self.scheduler.update(out, next_tokens)
        return out

    def _warn_ignored(self, request_id) -> None:
        """vLLM warns and marks an ignored request too: say why, with the numbers, and what to change."""
        self.stats.num_ignored += 1
        processor, manager = self._processors[request_id], self.block_manager
        finished = self.scheduler.finished[request_id]
        generated = max((len(t) for t in finished.values()), default=0) if isinstance(finished, dict) \
            else len(finished)
        tokens = len(processor.prompt_token_ids) + generated
        needed = -(-tokens // manager.block_size)
        warnings.warn(f"request {request_id!r} was ignored: its {tokens} tokens ({len(processor.prompt_token_ids)} "
                      f"of prompt, {generated} generated) need {needed} blocks of {manager.block_size} per sequence, "
                      f"more than the pool's {manager.num_total_gpu_blocks} GPU blocks allow (watermark "
                      f"{manager.watermark_blocks}); it returns the tokens it has. Give the engine more "
                      "num_gpu_blocks, a larger block_size, or shorter prompts and max_tokens.",
                      RuntimeWarning, stacklevel=3)

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

        for seq_id, tokens in out.prefills:
            num_cached = max(manager.num_cached_tokens(seq_id), out.shared_prefix.get(seq_id, 0))
            start = min(num_cached, len(tokens) - 1)  # a fully cached prompt still runs its last token
            table = manager.get_block_table(seq_id)
            rows = slice(len(input_ids), len(input_ids) + len(tokens) - start)
            input_ids += tokens[start:]
            positions += range(start, len(tokens))
            slots += [slot(table, p) if p >= num_cached else -1 for p in range(start, len(tokens))]
            prefills.append(_Prefill(rows, torch.tensor(table, dtype=torch.int32), len(tokens), start))
            last_rows.append(rows.stop - 1)
        decode_start = len(input_ids)
        tables, seq_lens = [], []
        for seq_id in out.decodes:
            table, num_tokens = manager.get_block_table(seq_id), manager.get_num_tokens(seq_id)
            input_ids.append(self.scheduler.get_seq(seq_id).output_token_ids[-1])
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

    def _sample(self, seq_ids: list, logits: torch.Tensor) -> dict:
        """Every live sequence's next token: each request's processor samples, forks and prunes its own."""
        argmax = logits.argmax(dim=-1).tolist()  # every greedy row at once
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        rows_by_request: dict = {}
        for row, seq_id in enumerate(seq_ids):
            rows_by_request.setdefault(self.scheduler.get_seq(seq_id).request_id, {})[seq_id] = row
        next_tokens = {}
        for request_id, rows in rows_by_request.items():
            next_tokens.update(self._processors[request_id].process(self.scheduler, rows, logits, logprobs, argmax))
        return next_tokens

    def _count(self, out: SchedulerOutputs) -> None:
        """Statistics of a step just scheduled: blocks in use now, prefix hits of its prefills."""
        manager = self.block_manager
        self.stats.steps += 1
        self.stats.num_preemptions = self.scheduler.num_preemptions
        self.stats.num_prefix_cached_tokens += sum(manager.num_cached_tokens(s) for s, _ in out.prefills
                                                   if s not in out.shared_prefix)  # a fork's hits are its parent's
        self.stats.num_cow_copies += len(out.blocks_to_copy)
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
