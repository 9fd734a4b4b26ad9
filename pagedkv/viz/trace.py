"""A recorded run: every step's ``snapshot()`` as small JSON, for a player that needs no Python.

The trace is drawn from the same :class:`~pagedkv.state.ManagerState` the matplotlib maps draw
(``block_map.py``), so the browser's picture and the Python picture cannot disagree; each step also carries its
text block map exactly as ``print(snapshot)`` writes it, so the page can be checked against Python line for line.
``player.js`` (beside this file) plays it: in a notebook (``TracePlayer``, an anywidget), in one self-contained
HTML file (``python -m pagedkv trace <run> --html run.html``, opens from disk) and in the course site
(``make site``).

Record with :class:`TraceRecorder` around anything with a ``snapshot()``: ``record_engine`` steps an
``LLMEngine`` (v0 or v1), ``record_scheduler`` a bare ``Scheduler`` or ``v1.Scheduler`` with a stand-in model,
and ``recorder.record(label, ...)`` after each hand-made call on a ``PagedKVCache`` or ``BlockSpaceManager``.
``load_trace`` reads and checks a trace (every step's state rebuilt and its text map compared).

The format (``"format": "pagedkv-trace"``, ``"version": 1``), one JSON object:

- ``title``, ``source`` (what ran: ``"v1 engine"``, ``"v0 scheduler"``, ``"hand-driven cache"``...),
  ``description``; ``block_size``, ``num_gpu_blocks``, ``num_cpu_blocks``, ``watermark_blocks``,
  ``prefix_caching`` (bool), ``group_names`` (a hybrid model's KV cache groups, ``[]`` otherwise),
  ``null_block`` (its id, or null).
- ``ids``: every sequence or request named in the trace, as the maps write it (``seq_name``: ``"r3"``,
  ``"beam.2"``); elsewhere an id is its index in this list.
- ``hashes``: every block hash (prefix-cache name) in the trace; elsewhere a hash is its index here.
- ``steps``: one object per step, step 0 the state before anything ran. A key left out of a step means "as in
  the step before" (step 0 has every key); so a step stores only what changed:

  - ``blocks``: ``{"i": [ref_count, [owner ids], num_tokens, hash or -1]}`` for each block that changed; ``i``
    counts the GPU blocks first (block ``i``), then the CPU blocks (CPU block ``i - num_gpu_blocks``).
  - ``free``, ``free_cpu``: the free queues in order (``#0``, handed out next, first).
  - ``seqs``: every sequence holding blocks, in the snapshot's order: ``[id, device, num_tokens, tables]``
    (``tables``: one block table per KV cache group, one for a uniform model), or ``[id]`` for one unchanged
    since the step before.
  - ``prefix_stats``: ``{hits, misses, evictions, hit_rate}``, or null without prefix caching.
  - ``counters``: numbers of the step (``steps``, ``num_preemptions``, ``blocks_used``, ...), those that changed.
  - ``text``: the text block map, one item per line, as edits of the step before's: a string (a new line),
    ``k`` (line ``k`` of the step before), ``[k, n]`` (its lines ``k`` to ``k + n - 1``), or ``[k, p, "s", q]``
    (line ``k``'s first ``p`` characters, then ``"s"``, then its last ``q`` characters).
  - ``label`` (``"step 12"``, ``"fork A -> B"``) and ``summary`` (a line saying what happened).
  - ``event``, only what happened: ``scheduled`` (``[[id, tokens]]``), ``admitted``, ``preempted``,
    ``finished`` (ids), ``freed`` (GPU block ids), ``copied`` (``[[src, dst]]`` copy-on-write), ``swapped_out``
    (``[[gpu, cpu]]``), ``swapped_in`` (``[[cpu, gpu]]``), ``running``, ``waiting``, ``swapped`` (the queues after
    the step, ids in order), ``highlight`` and ``sources`` (block indices, as ``blocks``' keys, to outline in red
    and purple, as ``draw_block_map``'s arguments).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from pathlib import Path

from ..errors import PagedKVError, PagedKVValueError
from ..state import BlockState, ManagerState, render_state, seq_name

FORMAT, VERSION = "pagedkv-trace", 1
PLAYER_JS = Path(__file__).with_name("player.js")
EVENT_LISTS = ("admitted", "preempted", "finished", "running", "waiting", "swapped")  # lists of ids
EVENT_PAIRS = ("copied", "swapped_out", "swapped_in")  # lists of [block, block]


# ----------------------------------------------------------------------------------------------- recording
class TraceRecorder:
    """Records ``target.snapshot()`` step by step: ``record(label, ...)`` after each step or call.

    ``target``: anything with a ``snapshot()`` returning a ``ManagerState`` (``LLMEngine``, ``PagedKVCache``,
    ``BlockSpaceManager``, ``v1.KVCacheManager``). The state before anything ran is recorded at once as step 0.
    """

    def __init__(self, target, title: str = "", source: str = "", description: str = "", label: str = "start"):
        if not callable(getattr(target, "snapshot", None)):
            raise PagedKVValueError(f"TraceRecorder records something with a snapshot() (an engine, a cache, a "
                                    f"block manager), got {type(target).__name__}.")
        self.target = target
        state = target.snapshot()
        self.data = {"format": FORMAT, "version": VERSION, "title": str(title), "source": str(source),
                     "description": str(description), "block_size": state.block_size,
                     "num_gpu_blocks": state.num_gpu_blocks, "num_cpu_blocks": state.num_cpu_blocks,
                     "watermark_blocks": state.watermark_blocks, "prefix_caching": bool(state.prefix_caching),
                     "group_names": list(state.group_names), "null_block": state.null_block,
                     "ids": [], "hashes": [], "steps": []}
        self._ids: dict = {}
        self._hashes: dict = {}
        self._last: dict | None = None  # the last step's full frame (encoded)
        self._last_state: ManagerState | None = None
        self._counters: dict = {}
        self.record(label, state=state)

    @property
    def num_steps(self) -> int:
        return len(self.data["steps"])

    def _id(self, seq_id) -> int:
        if seq_id not in self._ids:
            self._ids[seq_id] = len(self.data["ids"])
            self.data["ids"].append(seq_name(seq_id))
        return self._ids[seq_id]

    def _hash(self, block_hash) -> int:
        if block_hash is None:
            return -1
        if block_hash not in self._hashes:
            self._hashes[block_hash] = len(self.data["hashes"])
            self.data["hashes"].append(block_hash)
        return self._hashes[block_hash]

    def _frame(self, state: ManagerState) -> dict:
        """The full encoded state of one step (before delta encoding)."""
        blocks = [[b.ref_count, [self._id(s) for s in b.seq_ids], b.num_tokens, self._hash(b.block_hash)]
                  for b in state.blocks]
        seqs = []
        for seq_id, table in state.tables.items():
            tables = state.group_tables.get(seq_id, (table,))
            seqs.append([self._id(seq_id), state.seq_devices[seq_id], state.seq_lens.get(seq_id),
                         [list(t) for t in tables]])
        return {"blocks": blocks, "free": state.free_block_ids("gpu"), "free_cpu": state.free_block_ids("cpu"),
                "seqs": seqs, "prefix_stats": dict(state.prefix_stats) if state.prefix_stats is not None else None,
                "text": render_state(state).split("\n")}

    def record(self, label: str, *, state: ManagerState | None = None, summary: str = "", scheduled=None,
               admitted=(), preempted=(), finished=(), copied=(), swapped_out=(), swapped_in=(), queues=None,
               counters: dict | None = None, highlight=None, sources=()) -> dict:
        """Add a step: the target's snapshot now (or ``state``) and what happened. ``scheduled``: ``{id: tokens}``;
        ``queues``: ``{"running": [...], "waiting": [...], "swapped": [...]}``; ``highlight``: GPU block ids to
        outline (default: the blocks this step took from the free queue, and copy destinations); ``sources``: copy
        sources (default: those of ``copied``). Returns the step as stored."""
        state = self.target.snapshot() if state is None else state
        if not isinstance(state, ManagerState):
            raise PagedKVValueError(f"snapshot() gave {type(state).__name__}, not a ManagerState.")
        frame = self._frame(state)
        step = {"label": str(label)}
        if summary:
            step["summary"] = str(summary)
        last = self._last
        if last is None:
            step.update({k: frame[k] for k in ("free", "free_cpu", "seqs", "prefix_stats")})
            step["blocks"] = {str(i): b for i, b in enumerate(frame["blocks"])}
            step["text"] = frame["text"]
        else:
            changed = {str(i): b for i, (a, b) in enumerate(zip(last["blocks"], frame["blocks"])) if a != b}
            if changed:
                step["blocks"] = changed
            for key in ("free", "free_cpu", "prefix_stats"):
                if frame[key] != last[key]:
                    step[key] = frame[key]
            if frame["seqs"] != last["seqs"]:
                before = {s[0]: s for s in last["seqs"]}
                step["seqs"] = [[s[0]] if before.get(s[0]) == s else s for s in frame["seqs"]]
            step["text"] = encode_lines(last["text"], frame["text"])
        numbers = {**_state_counters(state), **(counters or {})}
        changed_counters = {k: v for k, v in numbers.items() if self._counters.get(k) != v}
        if changed_counters:
            step["counters"] = changed_counters
        self._counters.update(numbers)
        event = self._event(state, scheduled, admitted, preempted, finished, copied, swapped_out, swapped_in,
                            queues, highlight, sources)
        if event:
            step["event"] = event
        self.data["steps"].append(step)
        self._last, self._last_state = frame, state
        return step

    def _event(self, state, scheduled, admitted, preempted, finished, copied, swapped_out, swapped_in, queues,
               highlight, sources) -> dict:
        event = {}
        if scheduled:
            event["scheduled"] = [[self._id(r), int(n)] for r, n in dict(scheduled).items()]
        for name, ids in (("admitted", admitted), ("preempted", preempted), ("finished", finished),
                          *((q, (queues or {}).get(q, ())) for q in ("running", "waiting", "swapped"))):
            if ids:
                event[name] = [self._id(r) for r in ids]
        previous = self._last_state
        if previous is not None:
            was_used = {b.block_id for b in previous.device_blocks("gpu") if not b.is_free}
            freed = sorted(b.block_id for b in state.device_blocks("gpu") if b.is_free and b.block_id in was_used)
            if freed:
                event["freed"] = freed
        for name, pairs in (("copied", copied), ("swapped_out", swapped_out), ("swapped_in", swapped_in)):
            if pairs:
                event[name] = [[int(a), int(b)] for a, b in pairs]
        if highlight is None:
            was_free = set() if previous is None else {b.block_id for b in previous.device_blocks("gpu") if b.is_free}
            highlight = sorted({b.block_id for b in state.device_blocks("gpu")
                                if not b.is_free and b.block_id in was_free} | {int(d) for _, d in copied})
        highlight = [self._block_index(ref) for ref in highlight]
        sources = [self._block_index(ref) for ref in (sources or [s for s, _ in copied])]
        if highlight:
            event["highlight"] = highlight
        if sources:
            event["sources"] = sources
        return event

    def _block_index(self, ref) -> int:
        """A GPU block id, or a ``(device, id)`` pair, as an index into ``blocks``."""
        device, block_id = ref if isinstance(ref, tuple) else ("gpu", ref)
        return int(block_id) + (self.data["num_gpu_blocks"] if device == "cpu" else 0)

    def trace(self) -> Trace:
        return Trace(json.loads(json.dumps(self.data)))


def encode_lines(before: list[str], after: list[str]) -> list:
    """``after`` as edits of ``before``: a string (a new line), ``k`` (line ``k`` of ``before``), ``[k, n]`` (lines
    ``k`` to ``k + n - 1``), or ``[k, p, "middle", s]`` (line ``k``'s first ``p`` characters, then ``middle``, then
    its last ``s``): a text map changes a few characters a step, mostly."""
    where: dict = {}
    starts: dict = {}  # a line's first 12 characters -> the lines of before that start so (edit candidates)
    for i, line in enumerate(before):
        where.setdefault(line, i)
        starts.setdefault(line[:12], []).append(i)
    out: list = []
    for line in after:
        k = where.get(line)
        if k is not None:
            last = out[-1] if out else None
            if isinstance(last, int) and last + 1 == k:
                out[-1] = [last, 2]
            elif isinstance(last, list) and len(last) == 2 and last[0] + last[1] == k:
                last[1] += 1
            else:
                out.append(k)
            continue
        best, cost = line, len(line)
        for k in starts.get(line[:12], ()):
            old = before[k]
            p = len(_common_prefix(old, line))
            s = len(_common_prefix(old[p:][::-1], line[p:][::-1]))
            if len(line) - p - s + 12 < cost:  # about what the four numbers and brackets take
                best, cost = [k, p, line[p:len(line) - s], s], len(line) - p - s + 12
        out.append(best)
    return out


def _common_prefix(a: str, b: str) -> str:
    return os.path.commonprefix([a, b])


def decode_lines(before: list[str], items: list) -> list[str]:
    """The inverse of :func:`encode_lines`; a ``PagedKVValueError`` for an item that does not fit ``before``."""
    lines = []
    for item in items:
        if isinstance(item, str):
            lines.append(item)
        elif _index_ok(item, before):
            lines.append(before[item])
        elif (isinstance(item, list) and len(item) == 2 and _index_ok(item[0], before) and isinstance(item[1], int)
              and 0 < item[1] and item[0] + item[1] <= len(before)):
            lines.extend(before[item[0]:item[0] + item[1]])
        elif (isinstance(item, list) and len(item) == 4 and _index_ok(item[0], before) and isinstance(item[2], str)
              and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (item[1], item[3]))
              and item[1] + item[3] <= len(before[item[0]])):
            old = before[item[0]]
            lines.append(old[:item[1]] + item[2] + old[len(old) - item[3]:])
        else:
            _fail(f"a text line {item!r}.")
    return lines


def _state_counters(state: ManagerState) -> dict:
    """What the block map's title and the visualizer's counters show, from the snapshot."""
    numbers = {"blocks_used": state.num_used("gpu"),
               "internal_fragmentation": round(state.internal_fragmentation, 3)}
    if state.num_cpu_blocks:
        numbers["cpu_blocks_used"] = state.num_used("cpu")
    return numbers


def record_engine(engine, title: str = "", description: str = "", max_steps: int = 200) -> Trace:
    """Step ``engine`` (an ``LLMEngine``, its requests added) until it has no unfinished request or ``max_steps``
    steps ran, recording every step: what was scheduled, admitted, preempted, copied, swapped, finished."""
    recorder = TraceRecorder(engine, title, f"{engine.version} engine", description)
    while engine.has_unfinished_requests() and recorder.num_steps <= max_steps:
        before = set(engine.scheduler.requests)
        out = engine.step()
        finished = [r for r in before if r not in engine.scheduler.requests]
        stats = {k: v for k, v in dataclasses.asdict(engine.stats).items() if isinstance(v, int)}
        _record_scheduler_step(recorder, engine.scheduler, out, finished, stats)
    return recorder.trace()


def record_scheduler(scheduler, target, title: str = "", description: str = "", max_steps: int = 200,
                     arrivals: dict | None = None) -> Trace:
    """Step a bare ``Scheduler`` (v0) or ``v1.Scheduler`` with a stand-in model (the scheduler never looks at what a
    token means), recording every step. ``target``: its block manager (for snapshots); ``arrivals``:
    ``{step: [(request_id, prompt, max_tokens), ...]}`` added before that step runs."""
    from .scheduler_widget import stand_in_model

    v1 = hasattr(scheduler, "kv_cache_manager")
    recorder = TraceRecorder(target, title, f"{'v1' if v1 else 'v0'} scheduler", description)
    arrivals = dict(arrivals or {})
    step = 0
    while recorder.num_steps <= max_steps and (scheduler.has_unfinished_requests() or any(k >= step for k in arrivals)):
        for request in arrivals.pop(step, ()):
            scheduler.add_request(*request)
        step += 1
        before = set(scheduler.requests)
        out = scheduler.schedule()
        if v1:
            sampled = {r: stand_in_model(scheduler.requests[r].all_token_ids)
                       for r in scheduler.sampling_request_ids(out)}
            scheduler.update_from_output(out, sampled)
        else:
            scheduler.update(out, {r: stand_in_model(scheduler.requests[r].token_ids) for r in out.scheduled})
        finished = [r for r in before if r not in scheduler.requests]
        _record_scheduler_step(recorder, scheduler, out, finished,
                               {"steps": step, "num_preemptions": scheduler.num_preemptions,
                                "num_recomputed_tokens": scheduler.num_recomputed_tokens})
    return recorder.trace()


def _record_scheduler_step(recorder, scheduler, out, finished, counters) -> None:
    number = recorder.num_steps
    queues = {"running": scheduler.running, "waiting": scheduler.waiting,
              "swapped": getattr(scheduler, "swapped", [])}
    if hasattr(out, "num_scheduled_tokens"):  # v1
        shares = ", ".join(f"{seq_name(r)} {n}" for r, n in out.num_scheduled_tokens.items())
        summary = f"step {number}: budget {out.total_num_scheduled_tokens}/{scheduler.max_num_batched_tokens}" \
                  f" tokens" + (f": {shares}" if shares else "")
        if out.preempted_req_ids:
            summary += "  PREEMPTED " + ", ".join(f"{seq_name(r)} (recompute)" for r in out.preempted_req_ids)
        recorder.record(f"step {number}", summary=summary, scheduled=out.num_scheduled_tokens,
                        admitted=out.scheduled_new_reqs, preempted=out.preempted_req_ids, finished=finished,
                        queues=queues, counters=counters)
        return
    parts = [f"step {number}:"]
    if out.prefills:
        parts.append("prefill " + ", ".join(f"{seq_name(r)} ({len(t)} tokens)" for r, t in out.prefills))
    if out.decodes:
        parts.append("decode " + ", ".join(seq_name(r) for r in out.decodes))
    if out.preempted:
        parts.append("PREEMPTED " + ", ".join(f"{seq_name(r)} ({'swap' if r in out.swapped_out else 'recompute'})"
                                             for r in out.preempted))
    if out.blocks_to_copy:
        parts.append("copy-on-write " + ", ".join(f"{s}->{d}" for s, d in out.blocks_to_copy))
    scheduled = {r: len(t) for r, t in out.prefills} | {r: 1 for r in out.decodes}
    recorder.record(f"step {number}", summary="  ".join(parts), scheduled=scheduled,
                    admitted=[r for r, _ in out.prefills], preempted=out.preempted, finished=finished,
                    copied=out.blocks_to_copy, swapped_out=out.blocks_to_swap_out, swapped_in=out.blocks_to_swap_in,
                    queues=queues, counters=counters,
                    highlight=None if not (out.blocks_to_swap_out or out.blocks_to_swap_in) else
                    [("cpu", c) for _, c in out.blocks_to_swap_out] + [g for _, g in out.blocks_to_swap_in])


# ------------------------------------------------------------------------------------------ reading back
class Trace:
    """A checked trace: ``data`` (the JSON object), ``states`` (a ``ManagerState`` per step), ``texts`` (each
    step's text map, as recorded and as ``render_state`` writes it again from ``states``), ``steps`` (each step's
    label, summary, event and counters)."""

    def __init__(self, data):
        self.data = data
        self.frames = decode(data)
        self.states = [_state(data, f) for f in self.frames]
        self.texts = ["\n".join(f["text"]) for f in self.frames]
        for i, (state, text) in enumerate(zip(self.states, self.texts)):
            if render_state(state) != text:
                raise PagedKVValueError(f"trace step {i}: its text map is not the map of its blocks and tables "
                                        "(the file was edited, or written by another version); record it again.")

    def __len__(self) -> int:
        return len(self.frames)

    def __repr__(self) -> str:
        return f"Trace({self.data['title']!r}, {self.data['source']}, {len(self)} steps)"

    def to_json(self) -> str:
        return json.dumps(self.data, separators=(",", ":"))

    def write(self, path) -> Path:
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    def html(self, title: str | None = None) -> str:
        return player_page(self, title)

    def write_html(self, path, title: str | None = None) -> Path:
        path = Path(path)
        path.write_text(self.html(title), encoding="utf-8")
        return path


def load_trace(source) -> Trace:
    """A trace from a path, a JSON string or an already parsed dict; a ``PagedKVValueError`` that says what is
    wrong with a file that is empty, not JSON, or not a pagedkv trace of this version."""
    if isinstance(source, Trace):
        return source
    looks_like_path = isinstance(source, str) and source.strip() and source.lstrip()[0] not in "{[\"" and \
        Path(source).is_file()
    if isinstance(source, Path) or looks_like_path:
        try:
            source = Path(source).read_text(encoding="utf-8")
        except OSError as error:
            raise PagedKVValueError(f"cannot read the trace {source}: {error.strerror or error}.") from None
    if isinstance(source, str):
        if not source.strip():
            raise PagedKVValueError("the trace is empty: record one with python -m pagedkv trace <run> --json "
                                    "run.json.")
        try:
            source = json.loads(source)
        except ValueError as error:
            raise PagedKVValueError(f"the trace is not JSON ({error}); record it again.") from None
    return Trace(source)


def _fail(message: str):
    raise PagedKVValueError(f"not a pagedkv trace: {message}")


def decode(data) -> list[dict]:
    """Every step's full frame (``blocks``, ``free``, ``free_cpu``, ``seqs``, ``prefix_stats``, ``counters``,
    ``text``, ``label``, ``summary``, ``event``), the deltas applied; checks the structure as it goes (the same
    checks as ``player.js``'s ``decodeTrace``). Anything else malformed is a ``PagedKVValueError`` too."""
    try:
        return _decode(data)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as error:
        if isinstance(error, PagedKVError):
            raise
        raise PagedKVValueError(f"not a pagedkv trace: malformed ({type(error).__name__}: {error}).") from None


def _decode(data) -> list[dict]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        _fail(f"expected a JSON object with \"format\": \"{FORMAT}\".")
    if data.get("version") != VERSION:
        _fail(f"version {data.get('version')!r}, this pagedkv reads version {VERSION}.")
    for key, kind in (("block_size", int), ("num_gpu_blocks", int), ("num_cpu_blocks", int), ("ids", list),
                      ("hashes", list), ("steps", list), ("group_names", list)):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            _fail(f"{key!r} must be {'an integer' if kind is int else 'a list'}.")
    if not data["steps"]:
        _fail("it has no steps.")
    num_blocks = data["num_gpu_blocks"] + data["num_cpu_blocks"]
    frames, frame = [], None
    for i, step in enumerate(data["steps"]):
        if not isinstance(step, dict):
            _fail(f"step {i} is not an object.")
        if i == 0:
            missing = [k for k in ("blocks", "free", "free_cpu", "seqs", "prefix_stats", "text") if k not in step]
            if missing or len(step["blocks"]) != num_blocks:
                _fail(f"step 0 must hold the whole state (missing {missing or 'some blocks'}).")
            frame = {"blocks": [None] * num_blocks, "counters": {}, "text": []}
        frame = {**frame, "blocks": list(frame["blocks"]), "counters": dict(frame["counters"]),
                 "label": step.get("label", f"step {i}"), "summary": step.get("summary", ""),
                 "event": step.get("event", {})}
        for key, block in step.get("blocks", {}).items():
            if not (str(key).isdigit() and int(key) < num_blocks) or not _block_ok(block, data):
                _fail(f"step {i}: block {key!r} is {block!r}.")
            frame["blocks"][int(key)] = block
        for key in ("free", "free_cpu", "prefix_stats"):
            if key in step:
                frame[key] = step[key]
        if "seqs" in step:
            before = {s[0]: s for s in frame["seqs"]} if i else {}
            seqs = []
            for s in step["seqs"]:
                s = before.get(s[0]) if isinstance(s, list) and len(s) == 1 else s
                if not (isinstance(s, list) and len(s) == 4 and _index_ok(s[0], data["ids"])
                        and s[1] in ("gpu", "cpu") and isinstance(s[3], list)):
                    _fail(f"step {i}: a sequence entry {s!r}.")
                seqs.append(s)
            frame["seqs"] = seqs
        frame["counters"].update(step.get("counters", {}))
        text = step.get("text", list(range(len(frame["text"]))))
        if not isinstance(text, list):
            _fail(f"step {i}: its text is not a list of lines.")
        frame["text"] = decode_lines(frame["text"], text)
        frames.append(frame)
    return frames


def _index_ok(value, table) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(table)


def _block_ok(block, data) -> bool:
    return (isinstance(block, list) and len(block) == 4 and all(isinstance(x, int) for x in (block[0], block[2]))
            and isinstance(block[1], list) and all(_index_ok(s, data["ids"]) for s in block[1])
            and (block[3] == -1 or _index_ok(block[3], data["hashes"])))


def _state(data, frame) -> ManagerState:
    """The ``ManagerState`` of one decoded step (sequence ids are their names)."""
    ids, hashes, num_gpu = data["ids"], data["hashes"], data["num_gpu_blocks"]
    try:
        free = {("gpu", b): i for i, b in enumerate(frame["free"])}
        free.update({("cpu", b): i for i, b in enumerate(frame["free_cpu"])})
        blocks = []
        for index, (ref, owners, num_tokens, block_hash) in enumerate(frame["blocks"]):
            device, block_id = ("gpu", index) if index < num_gpu else ("cpu", index - num_gpu)
            blocks.append(BlockState(block_id, device, ref, tuple(ids[o] for o in owners), num_tokens,
                                     hashes[block_hash] if block_hash >= 0 else None, free.get((device, block_id))))
        hybrid = bool(data["group_names"])
        seqs = {ids[s[0]]: s for s in frame["seqs"]}
        return ManagerState(
            block_size=data["block_size"], blocks=tuple(blocks),
            tables={name: list(s[3][0]) for name, s in seqs.items()},
            seq_devices={name: s[1] for name, s in seqs.items()},
            seq_lens={name: s[2] for name, s in seqs.items() if s[2] is not None},
            num_gpu_blocks=num_gpu, num_cpu_blocks=data["num_cpu_blocks"],
            watermark_blocks=data.get("watermark_blocks", 0), prefix_caching=bool(data.get("prefix_caching")),
            prefix_stats=frame["prefix_stats"],
            group_tables={name: tuple(list(t) for t in s[3]) for name, s in seqs.items()} if hybrid else {},
            group_names=tuple(data["group_names"]), null_block=data.get("null_block"))
    except (TypeError, ValueError, IndexError, KeyError) as error:
        raise PagedKVValueError(f"not a pagedkv trace: a step's state does not fit together ({error}).") from None


# ------------------------------------------------------------------------------------------------ the page
PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><link rel="icon" href="data:,">
<style>body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
.pkv-open {{ margin: 1em 0; font-size: 0.9em; color: #555; }}</style>
</head><body>
<h1>{title}</h1>
<p>{description}</p>
{player}
<p class="pkv-open"><label>Play another trace file (<code>python -m pagedkv trace &lt;run&gt; --json run.json</code>):
<input type="file" accept=".json,application/json" class="pkv-file"></label></p>
{script}
</body></html>
"""


def player_markup(trace: Trace | None, element_id: str = "pkv-player-0") -> str:
    """A player's element with its trace inside (a ``<script type="application/json">``, ``</`` escaped)."""
    text = "" if trace is None else trace.to_json().replace("</", "<\\/")
    return (f'<div class="pkv-player" id="{element_id}" data-trace="{element_id}-data"></div>\n'
            f'<script type="application/json" id="{element_id}-data">{text}</script>')


def player_script() -> str:
    """The player module inline (so a page opened from disk needs no server and no other file), then one call that
    mounts every ``.pkv-player`` element of the page and wires the file inputs."""
    source = PLAYER_JS.read_text(encoding="utf-8")
    if "</script" in source.lower():
        raise PagedKVError("player.js holds '</script', which would end its inline <script> early.")
    return f'<script type="module">\n{source}\nmountAll(document);\n</script>'


def player_page(trace: Trace | None, title: str | None = None) -> str:
    """A self-contained HTML page that plays ``trace`` (no server, no network: everything inline)."""
    title = title or (trace.data["title"] if trace is not None else "") or "pagedkv trace"
    description = "" if trace is None else trace.data.get("description", "")
    return PAGE.format(title=html.escape(title), description=html.escape(description),
                       player=player_markup(trace), script=player_script())
