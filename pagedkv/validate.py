"""Argument checks shared by every public entry point: one place, one wording.

Each check names the argument, shows the value and says what to pass instead,
and raises a :class:`PagedKVValueError` (also a ``ValueError``) *before* the
caller changes any state.  Token ids are Python ints or numpy/torch integer
scalars that fit in int64; sizes are ints, never bools.
"""

from __future__ import annotations

from numbers import Integral

from .errors import EmptyPromptError, PagedKVValueError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def is_list_like(value, ndim: int = 1) -> bool:
    """A list, tuple, array or tensor of ``ndim`` dimensions: not a str, a dict, a number or a 0-d array."""
    return (not isinstance(value, (str, bytes, dict)) and hasattr(value, "__iter__")
            and getattr(value, "ndim", ndim) == ndim)


def check_int(name: str, value, minimum: int | None = None) -> int:
    """``value`` as an int; bools, floats and strings are refused (``True`` is not a size)."""
    if type(value) is int and (minimum is None or value >= minimum):  # the common case, without ABC checks
        return value
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise PagedKVValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if minimum is not None and value < minimum:
        raise PagedKVValueError(f"{name} must be >= {minimum}, got {value}.")
    return value


def check_token_ids(name: str, token_ids, allow_empty: bool = False) -> list[int]:
    """A list of int token ids from any iterable of integer scalars (not a string, not nested)."""
    if type(token_ids) is list and len(token_ids) == 1:  # a decode step's one sampled token: the hottest call
        token = token_ids[0]
        if type(token) is int and INT64_MIN <= token <= INT64_MAX:
            return [token]
    if not is_list_like(token_ids):  # a 0-d array or tensor is one number, not a list
        raise PagedKVValueError(f"{name} must be a flat list of integers (token ids), got {token_ids!r}.")
    tokens = list(token_ids)
    if not tokens:
        if allow_empty:
            return tokens
        raise EmptyPromptError(f"{name} is empty; a request needs at least one token.")
    if set(map(type, tokens)) == {int} and INT64_MIN <= min(tokens) and max(tokens) <= INT64_MAX:
        return tokens  # the common case: plain ints, checked at C speed
    items, tokens = tokens, []
    for i, token in enumerate(items):
        if hasattr(token, "item") and getattr(token, "ndim", 0) == 0:
            token = token.item()  # a numpy or torch scalar
        if isinstance(token, bool) or not isinstance(token, Integral) or not INT64_MIN <= token <= INT64_MAX:
            raise PagedKVValueError(f"{name}[{i}] is {token!r}: token ids must be integers that fit in int64 "
                                    "(tokenize text first; pass a flat list of ints).")
        tokens.append(int(token))
    return tokens


def check_hashable(name: str, value) -> None:
    try:
        hash(value)
    except TypeError:
        raise PagedKVValueError(f"{name} must be hashable (a str or an int, say), got {value!r}.") from None


def check_choice(name: str, value, choices) -> str:
    """One of a few names (a pool, a device, a policy, a backend): a str in ``choices``, nothing else.

    Checked as a str first, so a list or an array gets this message instead of ``unhashable type``."""
    if not isinstance(value, str) or value not in choices:
        names = [repr(c) for c in choices]
        either = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise PagedKVValueError(f"{name} must be {either}, got {value!r}.")
    return value


def check_tensor(name: str, value):
    """A torch.Tensor (a numpy array, a list or a number is refused with what to pass instead)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise PagedKVValueError(f"{name} must be a torch.Tensor, got {type(value).__name__} "
                                f"(wrap numbers with torch.tensor(...), arrays with torch.from_numpy(...)).")
    return value


def check_int_list(name: str, values, minimum: int | None = None) -> list[int]:
    """A flat list of ints (block ids, slots, lengths) from any 1-d iterable of integer scalars."""
    if not is_list_like(values):
        raise PagedKVValueError(f"{name} must be a flat list of integers, got {values!r}.")
    out = []
    for i, value in enumerate(values):
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        out.append(check_int(f"{name}[{i}]", value, minimum))
    return out
