"""Hand the C heap's free memory back to the OS (``trim_heap``), so a burst does not leave RSS high.

A burst of large requests (multi-megabyte bodies parsed into Python objects and freed again)
leaves glibc's heap with free chunks it keeps for later: RSS stays up for as long as the process
lives (16 bodies of 3.9 MB: 120 MB still held 15 s later). ``malloc_trim(0)`` returns the free
pages of every arena. The app's periodic sweep calls it at most every 10 s (``app.py``'s
``TRIM_INTERVAL_S``, whatever the sweep's own period), off the event loop; it takes the heap's locks
while it walks the arenas (well under a millisecond on an idle heap, more on a large one), so not
more often. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():  # noqa: ANN202 - a ctypes function or None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS; whether any were (False where there is no glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
