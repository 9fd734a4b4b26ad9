"""Answer checks for the exercises: a friendly line, never a bare assertion traceback.

Each check compares a student's answer with what the package itself computes
and prints either a pass message or what differs (the input, what was
expected, what was given).  Checks print and return None, so a notebook cell shows only the message.
"""

from __future__ import annotations

from ..sizing import MODELS, ModelSpec, cache_block_bytes

PASS, FAIL = "[ok]", "[not yet]"


def report(name: str, got, expected, hint: str = "", tolerance: float = 0.0) -> None:
    """Print whether ``got`` equals ``expected`` (within a relative ``tolerance`` for numbers)."""
    if got is None or got is Ellipsis:
        print(f"{FAIL} {name}: no answer yet - replace the ... with your answer.")
        return
    try:
        ok = abs(got - expected) <= tolerance * abs(expected) if tolerance else got == expected
    except TypeError:
        ok = False
    if ok:
        print(f"{PASS} {name}: {got!r} is right.")
    else:
        print(f"{FAIL} {name}: expected {expected!r}, got {got!r}." + (f" Hint: {hint}" if hint else ""))


def block_bytes(answer, spec: ModelSpec | None = None, block_size: int = 16) -> None:
    """Bytes of one block of ``spec`` (default Llama-3-8B in fp16)."""
    spec = spec or MODELS["llama-3-8b"]
    report(f"bytes of a {block_size}-token block of {spec.name}", answer, cache_block_bytes(spec, block_size),
                  "K and V (x2), every layer, every KV head (not every query head), head_size, bytes per element.")


def function_cases(name: str, student_fn, reference_fn, cases) -> None:
    """Run ``student_fn`` and ``reference_fn`` on each case; report the first difference."""
    for args in cases:
        expected = reference_fn(*args)
        try:
            got = student_fn(*args)
        except NotImplementedError:
            print(f"{FAIL} {name}: not written yet (it raises NotImplementedError).")
            return
        except Exception as e:  # a student's bug: show it as a message, not a traceback
            print(f"{FAIL} {name}{args}: raised {type(e).__name__}: {e}")
            return
        if got != expected:
            print(f"{FAIL} {name}{args}: expected {expected!r}, got {got!r}.")
            return
    print(f"{PASS} {name}: all {len(cases)} cases right.")


def slot_mapping(fn) -> None:
    """``fn(block_table, block_size, num_tokens) -> list of slots``."""

    def reference(table, block_size, num_tokens):
        return [table[pos // block_size] * block_size + pos % block_size for pos in range(num_tokens)]

    cases = [([0], 4, 3), ([2, 0], 4, 6), ([7, 3, 5], 2, 5), ([1, 9], 16, 17)]
    function_cases("slot_mapping", fn, reference, cases)
