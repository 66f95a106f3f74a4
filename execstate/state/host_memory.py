"""Giving freed host memory back to the operating system (docs/security.md: released state really goes).

Python and torch free a released checkpoint's objects at once, but the C allocator keeps the
pages: small blocks freed in the middle of the heap stay resident, so a server's RSS would not
come down after a session with thousands of checkpoints closes. :func:`trim` asks glibc to return
every free page (``malloc_trim(0)``: it walks the heap, about a millisecond per 100 MiB); where the
C library has no such call it does nothing. Callers trim after releasing a lot at once
(``TRIM_AFTER_BYTES``), never per object.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

TRIM_AFTER_BYTES = 4 << 20


@functools.cache
def _malloc_trim() -> Callable[..., object] | None:  # a ctypes function or None
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> bool:
    """Return free heap pages to the OS; True if the C library could be asked."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
