"""Every error pagedkv raises, in one place.

Each class derives from :class:`PagedKVError` *and* from the builtin a Python
user would expect (``ValueError``, ``KeyError``), so ``except ValueError`` keeps
working.  Messages say what was wrong and what to do about it, and every call
that raises leaves the object it was called on exactly as it was.

vLLM raises plain ``ValueError`` in most of these places (for example
``NoFreeBlocksError(ValueError)`` in ``vllm/core/block/interfaces.py``); here
each failure gets its own name so a notebook can catch precisely one.
"""


class PagedKVError(Exception):
    """Base class of every error raised by pagedkv."""


class PagedKVValueError(PagedKVError, ValueError):
    """A bad argument: wrong size, wrong shape, out-of-range number."""


class PagedKVKeyError(PagedKVError, KeyError):
    """A lookup of something that does not exist (e.g. an unknown sequence)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class NoFreeBlocksError(PagedKVValueError):
    """The pool has fewer free blocks than the call needs."""


class DoubleFreeError(PagedKVValueError):
    """A block whose reference count is already 0 was freed again."""


class UnknownSequenceError(PagedKVKeyError):
    """A sequence id that the manager does not know."""


class DuplicateSequenceError(PagedKVValueError):
    """A sequence id that is already in use."""


class EmptyPromptError(PagedKVValueError):
    """A sequence must start with at least one token."""


class WrongDeviceError(PagedKVValueError):
    """The sequence is not on the device this call needs (swapped out, or in)."""


class ShapeError(PagedKVValueError):
    """A tensor has the wrong shape, dtype or layout for the call."""


class BlockTableError(PagedKVValueError):
    """A block table names a block outside the cache, or is too short."""


class ModelFileError(PagedKVValueError):
    """A model file that is missing, not of the expected format, damaged, or of an unsupported kind."""
