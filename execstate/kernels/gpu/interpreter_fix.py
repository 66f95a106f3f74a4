"""A fix for Triton's CPU interpreter under numpy >= 2.4, applied only under the interpreter.

Triton 3.6's interpreter holds a scalar as a one-element array and converts it to a Python
int with ``int(array)`` (a loop bound read from memory, ``range(0, n)``), which numpy 2.4 made
an error for arrays of one dimension ("only 0-dimensional arrays can be converted to Python
scalars"). The fix reads the one element instead; compiled kernels are not affected.
"""

from __future__ import annotations

from typing import Any


def apply() -> None:
    """Patch the interpreter's scalar conversion (idempotent; call only under the interpreter)."""
    import triton.runtime.interpreter as interp

    patch = interp._patch_lang_tensor
    if getattr(patch, "execstate_fixed", False):
        return

    def fixed(tensor: Any, scope: Any) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    fixed.execstate_fixed = True  # type: ignore[attr-defined]
    interp._patch_lang_tensor = fixed
