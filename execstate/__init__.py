"""execstate: an LLM inference runtime whose cache holds execution state.

Public API (vLLM-compatible names)::

    from execstate import LLM, SamplingParams
    from execstate import World     # world-model sessions (session/world_offline.py)

Imported lazily, so the pure-Python layers (identity/, state/ bookkeeping) load
without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "ScoreOutput", "World"]
__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "execstate.engine.llm",
    "SamplingParams": "execstate.engine.sampling_params",
    "RequestOutput": "execstate.engine.outputs",
    "CompletionOutput": "execstate.engine.outputs",
    "ScoreOutput": "execstate.engine.outputs",
    "World": "execstate.session.world_offline",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'execstate' has no attribute {name!r}")
