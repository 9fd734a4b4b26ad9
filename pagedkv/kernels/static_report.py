"""How fast would the kernels run on a real GPU? A static answer, with no GPU.

Each kernel is compiled to PTX (``ptx.py``), linked for a real architecture by
nvJitLink through ``cuda.core``'s ``Linker`` (its verbose log gives registers,
spills, shared and local memory), and disassembled to SASS with NVIDIA's
``nvdisasm`` (the ``perf`` extra: ``pip install -e '.[perf]'``).

What is measured, and what is an estimate:

* **registers, spills, shared / local memory**: exactly what ptxas reports.
* **occupancy**: the theoretical one, from registers, shared memory and
  threads per block against the SM's limits (as NVIDIA's occupancy calculator
  does, without its rounding of shared memory to allocation units).
* **instructions per (query head, token)**: an *estimate from the static code*.
  The innermost loops that load fp16 K or V from the cache and multiply (FFMA)
  are found in the SASS (a backward branch closes a loop; the loop that copies
  q has no FFMA).  A loop body of ``n`` instructions
  that loads ``e`` cache elements per thread costs ``n / e`` instructions per
  element; a warp instruction covers 32 lanes, so one token's ``head_size``
  elements cost ``head_size * n / e / 32`` warp instructions.  Work outside
  those loops (the block table, per-token reductions) is not counted: a
  lower bound for each of the K and V passes.

The unified kernel (``cuda_unified.py``) gets its own rows, for a prefill tile
(vLLM's ``16 // gqa`` queries) and a decode tile (one query), counted per
(query head, key): see :func:`unified_loops` and :func:`decode_tile_loops`.

It only compiles, so it switches numba's simulator off for itself: run as
``python -m pagedkv.kernels.static_report`` on a machine with no GPU, it starts
itself again with ``NUMBA_ENABLE_CUDASIM=0`` (``ptx.without_simulator``).

Run it as ``python benchmarks/bench_attention.py --static``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import PagedKVError

# Per-SM limits (CUDA C Programming Guide, "Technical Specifications per Compute Capability").
SM_LIMITS = {
    (8, 0): dict(registers=65536, threads=2048, blocks=32, shared=164 * 1024),
    (9, 0): dict(registers=65536, threads=2048, blocks=32, shared=228 * 1024),
}
RESERVED_SHARED_PER_BLOCK = 1024  # the driver keeps 1 KB of shared memory per block (cc 8.0 and later)
REGISTER_GRANULE = 256  # registers are handed to warps in units of 256

_LOG = re.compile(r"used (\d+) registers.*?(\d+) bytes smem.*?(\d+) bytes lmem")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_LOAD_BYTES = {"U16": 2, "64": 8, "128": 16}  # fp16 cache loads; plain 32-bit loads are block-table reads


@dataclass(frozen=True)
class LinkInfo:
    registers: int
    spill_bytes: int
    shared_bytes: int
    local_bytes: int


@dataclass(frozen=True)
class Loop:
    start: int
    end: int
    instructions: int
    cache_elements: int  # fp16 elements of K or V one thread loads per iteration


def nvdisasm() -> str:
    """The path of NVIDIA's disassembler from its pip wheel, or a clear error."""
    for scheme in ("purelib", "platlib"):
        for sub in ("cu13", "cuda_nvdisasm", "cu12"):
            path = Path(sysconfig.get_paths()[scheme]) / "nvidia" / sub / "bin" / "nvdisasm"
            if path.exists():
                return str(path)
    found = shutil.which("nvdisasm")
    if found:
        return found
    raise PagedKVError("nvdisasm was not found: pip install -e '.[perf]' (NVIDIA's disassembler wheel).")


def link(ptx: str, cc: tuple[int, int]) -> tuple[bytes, LinkInfo]:
    """Link PTX into a cubin for ``sm_<cc>`` with nvJitLink; return it and what ptxas reported."""
    from cuda.core import Linker, LinkerOptions, ObjectCode

    linker = Linker(ObjectCode.from_ptx(ptx.encode()),
                    options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}", verbose=True))
    cubin = linker.link("cubin").code
    return cubin, parse_link_log(linker.get_info_log())


def parse_link_log(log: str) -> LinkInfo:
    usage, spills = _LOG.search(log), _SPILLS.search(log)
    if usage is None or spills is None:
        raise PagedKVError(f"could not read the linker's report; its log was:\n{log}")
    registers, shared, local = (int(x) for x in usage.groups())
    return LinkInfo(registers, int(spills[1]) + int(spills[2]), shared, local)


def occupancy(info: LinkInfo, threads_per_block: int, cc: tuple[int, int]) -> float:
    """Theoretical occupancy: resident warps per SM over the SM's maximum."""
    limits = SM_LIMITS[cc]
    warps = -(-threads_per_block // 32)
    registers_per_warp = -(-info.registers * 32 // REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = limits["registers"] // (registers_per_warp * warps)
    by_shared = limits["shared"] // (info.shared_bytes + RESERVED_SHARED_PER_BLOCK)
    blocks = min(by_registers, by_shared, limits["threads"] // threads_per_block, limits["blocks"])
    return blocks * warps / (limits["threads"] // 32)


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([nvdisasm(), "-c", path], capture_output=True, text=True, check=True).stdout


def kernel_sass(sass: str, name: str) -> list[str]:
    """The lines of the one function whose mangled name contains ``name`` (helpers like division left out)."""
    sections = re.split(r"\n(?=\s*\.section\s)", sass)
    for section in sections:
        header = section.split("\n", 1)[0]
        if ".text." in header and name in header:
            return section.splitlines()
    raise PagedKVError(f"no function named like {name!r} in the disassembly.")


def innermost_loops(lines: list[str]) -> list[tuple[int, int, list[str]]]:
    """``(start, end, instruction texts)`` of each innermost loop: a backward branch to a label above it, with no
    loop inside."""
    labels, instructions, pending = {}, [], []
    for line in lines:
        label = _LABEL.match(line.strip())
        if label:
            pending.append(label[1])
            continue
        found = _INSTRUCTION.search(line)
        if found:
            address = int(found[1], 16)
            for name in pending:
                labels[name] = address
            pending = []
            instructions.append((address, found[2]))
    loops = []
    for address, text in instructions:
        target = _BRANCH.search(text)
        if target and labels.get(target[1], address + 1) <= address:
            loops.append((labels[target[1]], address))
    innermost = [(s, e) for s, e in loops if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in loops)]
    return [(start, end, [text for address, text in instructions if start <= address <= end])
            for start, end in sorted(set(innermost))]


def cache_loops(lines: list[str]) -> list[Loop]:
    """Innermost loops that load fp16 K or V elements from global memory and multiply (FFMA)."""
    result = []
    for start, end, body in innermost_loops(lines):
        elements = sum(fp16_elements_loaded(text) for text in body)
        if elements and any(opcode(text).startswith("FFMA") for text in body):
            result.append(Loop(start, end, len(body), elements))
    return result


def opcode(instruction: str) -> str:
    """``LDG.E.U16`` of ``@P0 LDG.E.U16 R6, [R6.64]``: the predicate skipped."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def fp16_elements_loaded(instruction: str) -> int:
    """fp16 elements one global load brings in (LDG.E.U16: 1, LDG.E.64: 4, LDG.E.128: 8; other: 0)."""
    op = opcode(instruction)
    if not op.startswith("LDG"):
        return 0
    parts = op.split(".")
    return next((size // 2 for suffix, size in _LOAD_BYTES.items() if suffix in parts), 0)


def instructions_per_token(loop: Loop, head_size: int) -> float:
    """Warp instructions per (query head, token) for one pass (K or V): see the module docstring."""
    return head_size * loop.instructions / loop.cache_elements / 32


KERNEL_NAMES = {"v1": "paged_attention_v1", "v2": "paged_attention_v2B", "reduce": "paged_attention_v2_reduce"}


def measure(flavour: str, kernel: str, head_size: int, cc: tuple[int, int], threads: int = 128,
            block_size: int = 16, partition_size: int = 512, gqa: int = 4) -> dict:
    """One row of the report for an fp16 kernel: what the linker says, occupancy, and the cache loops.

    ``gqa`` query heads share a KV head.  Only ``"vllm-gqa"`` shares the loads between them, so its loop
    costs are divided by ``gqa`` to give a cost per *query* head."""
    from .cuda_vllm import heads_per_block
    from .ptx import compile_one

    heads = heads_per_block(flavour, gqa)
    ptx = compile_one(flavour, kernel, "float16", cc, head_size, block_size, partition_size, threads, gqa)
    cubin, info = link(ptx, cc)
    loops = cache_loops(kernel_sass(disassemble(cubin), KERNEL_NAMES[kernel])) if kernel != "reduce" else []
    return dict(flavour=flavour, kernel=kernel, head_size=head_size, gqa=gqa, sm=f"sm_{cc[0]}{cc[1]}",
                registers=info.registers, spill_bytes=info.spill_bytes, shared_bytes=info.shared_bytes,
                local_bytes=info.local_bytes, occupancy=occupancy(info, threads, cc),
                loops=[(loop.instructions, loop.cache_elements, instructions_per_token(loop, head_size) / heads)
                       for loop in loops])


def format_row(row: dict) -> str:
    loops = ", ".join(f"{n} instr/{e} elem -> {per:.0f}" for n, e, per in row["loops"]) or "-"
    gqa = row["gqa"] if row["flavour"] == "vllm-gqa" else "-"
    return (f"{row['sm']:<6} {row['flavour']:<8} {row['kernel']:<6} {row['head_size']:>4} {gqa:>3} "
            f"{row['registers']:>4} {row['spill_bytes']:>6} {row['shared_bytes']:>6} {row['local_bytes']:>5} "
            f"{row['occupancy']:>5.0%}  {loops}")


HEADER = ("sm     flavour  kernel head gqa regs spills  smem B lmem  occup. cache loops: body / fp16 elements "
          "per thread -> warp instructions per (query head, token), lower bound")

# The issue-rate model behind the HBM estimate (an H100 SXM5; NVIDIA's H100 datasheet and whitepaper):
# 132 SMs x 4 warp schedulers, each issuing one warp instruction per clock at the 1.98 GHz boost clock, against
# 3.35 TB/s of HBM3 (1.755 GHz is the PCIe card's boost clock, and that card has 114 SMs and 2 TB/s).
H100_WARP_INSTRUCTIONS_PER_S = 132 * 4 * 1.98e9
H100_HBM_BYTES_PER_S = 3.35e12


def hbm_fraction(instructions: float, head_size: int, gqa: int, element_bytes: int = 2) -> float:
    """The fraction of H100 HBM bandwidth a kernel could use if issuing instructions were its only limit.

    Per (query head, token) it issues ``instructions`` warp instructions and the cache holds
    ``2 * head_size * element_bytes / gqa`` bytes of K and V (one KV head serves ``gqa`` query heads).
    Issue-bound, that streams ``bytes * issue rate / instructions`` per second.  Above 1 the issue rate is not
    the limit: the kernel would be memory-bound.  An estimate: no latency, no stalls, the loop bodies only (a
    lower bound on instructions, so an upper bound on this fraction).
    """
    bytes_per_query_head_token = 2 * head_size * element_bytes / gqa
    return bytes_per_query_head_token * H100_WARP_INSTRUCTIONS_PER_S / instructions / H100_HBM_BYTES_PER_S


def summary_line(row: dict, gqa: int) -> str:
    """``static summary: sm_90 vllm-gqa head 128 fp16 gqa 4: N warp instructions per (query head, token) ...``."""
    total = sum(per for _, _, per in row["loops"])
    return (f"static summary: {row['sm']} {row['flavour']} head {row['head_size']} fp16 gqa {gqa}: {total:.0f} "
            f"warp instructions per (query head, token) (K + V loops, a lower bound), occupancy "
            f"{row['occupancy']:.0%}, {row['spill_bytes']} bytes spilled; issuing them allows <= "
            f"{hbm_fraction(total, row['head_size'], gqa):.0%} of H100 HBM bandwidth (an estimate from an "
            "issue-rate model, not measured; over 100%: memory-bound)")


# ----------------------------------------------------------------------------- the unified kernel (cuda_unified.py)
UNIFIED_TILES = ("prefill", "decode")  # a tile of vLLM's 16 // gqa queries, or of one query (a decode)


def unified_loops(lines: list[str], head_size: int, block_m: int) -> dict:
    """Warp instructions per (query head, key) in a prefill tile's three streaming loops.

    * ``K``: ``qk_logits``' dot product (both operands from shared memory: a K value loaded once for the rows a
      thread owns);
    * ``V``: ``weighted_values``' sum over a page's keys (a value loaded once for the rows a thread owns);
    * ``load``: ``load_page``, which copies a page's fp16 K and V words (8-byte loads) to shared memory once for
      the tile's ``block_m`` rows, so its cost per (query head, key) is divided by ``block_m``.

    A loop's cost: ``n / f`` instructions per FFMA, times the ``head_size`` FFMAs one (row, key) pair needs, over
    32 lanes (``load``: ``n / e`` per fp16 element, ``2 * head_size`` elements).  The K and V loops are the first
    two innermost loops that multiply (FFMA) and read shared memory (LDS) but neither load the cache (the decode
    tile's loops do) nor exponentiate (MUFU: the softmax); ``load`` is the first loop whose global loads are all
    8-byte words and that multiplies nothing (the queries are staged with 2-byte loads).  The softmax and the
    block-table reads are not counted: a lower bound, as for the decode kernels.
    """
    shared, loading = [], []
    for _, _, body in innermost_loops(lines):
        ops = [opcode(text) for text in body]
        ffma = sum(op.startswith("FFMA") for op in ops)
        lds = sum(op.startswith("LDS") for op in ops)
        loads = [fp16_elements_loaded(text) for text in body if opcode(text).startswith("LDG")]
        elements = sum(loads)
        if ffma and lds and not elements and not any(op.startswith("MUFU") for op in ops):
            shared.append(len(body) / ffma * head_size / 32)
        elif loads and all(n >= 4 for n in loads) and not ffma:
            loading.append(len(body) / elements * 2 * head_size / 32 / block_m)
    if len(shared) < 2 or not loading:
        raise PagedKVError(f"expected the prefill tile's K and V loops and a page-load loop in the SASS, found "
                           f"{len(shared)} shared-memory FFMA loops and {len(loading)} word-load loops.")
    return {"K": shared[0], "V": shared[1], "load": loading[0]}


def decode_tile_loops(lines: list[str], head_size: int, gqa: int) -> dict:
    """Warp instructions per (query head, key) of a decode tile: its K and V loops load the cache straight into
    FFMAs (the grouped decode kernel's), counted as the decode kernels are (:func:`instructions_per_token`) and
    shared by the ``gqa`` query heads of the group; nothing is staged, so ``load`` is 0."""
    loops = cache_loops(lines)
    if len(loops) != 2:
        raise PagedKVError(f"expected the decode tile's K and V loops in the SASS, found {len(loops)} cache loops.")
    k, v = (instructions_per_token(loop, head_size) / gqa for loop in loops)
    return {"K": k, "V": v, "load": 0.0}


def measure_unified(tile: str, head_size: int, cc: tuple[int, int], threads: int = 128, block_size: int = 16,
                    gqa: int = 4) -> dict:
    """One row for the unified kernel's fp16 tile: what the linker says, occupancy, and its streaming loops.

    ``prefill``: the kernel a mixed batch runs (both tiles), tiles of ``16 // gqa`` queries; ``decode``: the one a
    batch of decodes runs (``block_q = 1``, the decode tile alone)."""
    from .cuda_unified import choose_block_q
    from .ptx import compile_unified

    decodes_only = tile == "decode"
    block_q = 1 if decodes_only else choose_block_q(head_size, block_size, gqa)
    ptx = compile_unified("float16", cc, head_size, block_size, threads, block_q, gqa, decodes_only=decodes_only)
    cubin, info = link(ptx, cc)
    lines = kernel_sass(disassemble(cubin), "unified_attention")
    loops = decode_tile_loops(lines, head_size, gqa) if decodes_only else unified_loops(lines, head_size,
                                                                                       block_q * gqa)
    return dict(tile=tile, block_q=block_q, head_size=head_size, gqa=gqa, sm=f"sm_{cc[0]}{cc[1]}",
                registers=info.registers, spill_bytes=info.spill_bytes, shared_bytes=info.shared_bytes,
                local_bytes=info.local_bytes, occupancy=occupancy(info, threads, cc), loops=loops)


UNIFIED_HEADER = ("sm     unified tile     head gqa regs spills  smem B lmem  occup. warp instructions per "
                  "(query head, key): K + V + page loads, lower bound")


def format_unified_row(row: dict) -> str:
    tile = f"{row['tile']} {row['block_q']}x{row['gqa']}"
    loops = row["loops"]
    return (f"{row['sm']:<6} {tile:<16} {row['head_size']:>4} {row['gqa']:>3} {row['registers']:>4} "
            f"{row['spill_bytes']:>6} {row['shared_bytes']:>6} {row['local_bytes']:>5} {row['occupancy']:>5.0%}  "
            f"{loops['K']:.0f} + {loops['V']:.0f} + {loops['load']:.0f} = {sum(loops.values()):.0f}")


def unified_summary_line(row: dict) -> str:
    """``static summary: sm_90 unified prefill tile (4 queries x 4 heads) head 128 fp16: N warp instructions ...``."""
    total, block_m = sum(row["loops"].values()), row["block_q"] * row["gqa"]
    queries = "1 query" if row["block_q"] == 1 else f"{row['block_q']} queries"
    heads = "1 head" if row["gqa"] == 1 else f"{row['gqa']} heads"
    return (f"static summary: {row['sm']} unified {row['tile']} tile ({queries} x {heads}) head "
            f"{row['head_size']} fp16: {total:.0f} warp instructions per (query head, key) (K + V + page loads, a "
            f"lower bound), occupancy {row['occupancy']:.0%}, {row['spill_bytes']} bytes spilled; "
            f"issuing them allows <= {hbm_fraction(total, row['head_size'], block_m):.0%} of H100 HBM bandwidth "
            "(an estimate from an issue-rate model, not measured; over 100%: memory-bound)")


def main(argv=None) -> int:
    import argparse

    from .cuda import FLAVOURS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", nargs="+", default=["8.0", "9.0"], help="compute capabilities (8.0 and/or 9.0)")
    parser.add_argument("--head-size", nargs="+", type=int, default=[128, 256])
    parser.add_argument("--flavour", nargs="+", default=list(FLAVOURS), choices=FLAVOURS)
    parser.add_argument("--kernel", nargs="+", default=["v1", "v2", "reduce", "unified"],
                        choices=("v1", "v2", "reduce", "unified"),
                        help="unified: cuda_unified.py's kernel, a prefill tile and a decode tile (fp16)")
    parser.add_argument("--gqa", nargs="+", type=int, default=[1, 4],
                        help="query heads per KV head (1 is multi-head attention)")
    parser.add_argument("--json", help="also write the rows to this file (notebook 08's roofline reads "
                                       "pagedkv/data/static_estimates.json)")
    args = parser.parse_args(argv)
    from .ptx import report_missing_toolkit, without_simulator

    rerun = without_simulator("pagedkv.kernels.static_report", argv)  # it only compiles: no simulator
    if rerun is not None:
        return rerun
    return report_missing_toolkit(lambda: print_report(args))


def print_report(args) -> int:
    summaries, rows = [], []
    ccs = [tuple(int(x) for x in text.split(".")) for text in args.cc]
    for cc in ccs:
        if cc not in SM_LIMITS:
            raise PagedKVError(f"--cc must be one of {sorted(SM_LIMITS)}, got {cc}.")
    decode_kernels = [k for k in args.kernel if k != "unified"]
    if decode_kernels:
        print(HEADER)
    for cc in ccs:
        for head_size in args.head_size if decode_kernels else ():
            for flavour in args.flavour:
                # only vllm-gqa is built per group size; the others cost the same per query head at any gqa
                for gqa in (args.gqa if flavour == "vllm-gqa" else args.gqa[:1]):
                    for kernel in decode_kernels:
                        row = measure(flavour, kernel, head_size, cc, gqa=gqa)
                        rows.append(row)
                        print(format_row(row), flush=True)
                        if kernel == "v1" or (kernel == "v2" and "v1" not in args.kernel):
                            summaries += [summary_line(row, g) for g in ([gqa] if flavour == "vllm-gqa"
                                                                         else args.gqa)]
    if "unified" in args.kernel:
        print(UNIFIED_HEADER)
        for cc in ccs:
            for head_size in args.head_size:
                for gqa in args.gqa:
                    for tile in UNIFIED_TILES:
                        row = measure_unified(tile, head_size, cc, gqa=gqa)
                        rows.append(row)
                        print(format_unified_row(row), flush=True)
                        summaries.append(unified_summary_line(row))
    print("\n".join(summaries))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
