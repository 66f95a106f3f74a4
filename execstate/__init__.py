"""execstate: an LLM inference runtime whose cache holds execution state.

Public API (vLLM-compatible names)::

    from execstate import LLM, SamplingParams
    s = LLM("smollm2-moe").open_session()   # LM sessions (session/lm/llm.py: the engine's LLM + sessions)
    from execstate import World     # world-model sessions (session/world/offline.py)
    from execstate import AsyncSessions, AsyncWorld   # the same for an asyncio server

Imported lazily, so the pure-Python layers (identity/, state/ bookkeeping) load
without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "ScoreOutput", "World", "Session",
           "WorldSession", "AsyncSessions", "AsyncWorld", "SessionEventError"]
__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "execstate.session.lm.llm",
    "SamplingParams": "execstate.engine.sampling_params",
    "RequestOutput": "execstate.engine.outputs",
    "CompletionOutput": "execstate.engine.outputs",
    "ScoreOutput": "execstate.engine.outputs",
    "World": "execstate.session.world.offline",
    "Session": "execstate.session.lm.offline",
    "WorldSession": "execstate.session.world.offline",
    "AsyncSessions": "execstate.session.lm.async_sessions",
    "AsyncWorld": "execstate.session.world.async_world",
    "SessionEventError": "execstate.session.runtime.events",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'execstate' has no attribute {name!r}")
