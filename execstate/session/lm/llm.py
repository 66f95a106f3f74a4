"""``execstate.LLM``: the engine's offline API plus the engine's LM sessions, owned here.

The engine layer's ``LLM`` (``engine/llm.py``: generate, chat, score, update_weights) knows
nothing of sessions; the session layer wraps it. This class is what users get as
``execstate.LLM``::

    llm = LLM("smollm2-moe", enable_return_routed_experts=True, seed=0)
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=8))          # the engine's API
    s = llm.open_session(sampling_params=SamplingParams(temperature=0.8, seed=1))
    r = s.step([1, 2, 3], max_tokens=16)    # session/lm/offline.py
    llm.session(s.session_id)               # a handle of a resident session (e.g. after a migration)
    llm.sessions                            # the engine's LMSessions (session/lm/sessions.py)

Ownership: the constructor builds the engine's one ``LMSessions`` (it installs the sessions' LRU
eviction as the engine's KV-pressure reclaimer) and keeps it in ``sessions``; every session of
this LLM, and a migration to it (``Session.migrate(llm)``), goes through that object. Not
thread-safe (like the engine's ``LLM``): the caller's thread is the engine's thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from execstate.engine import llm as engine_llm
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.session_port import SessionPort
from execstate.session.lm.offline import Session
from execstate.session.lm.sessions import LMSessions

if TYPE_CHECKING:
    from execstate.engine.pd_config import ImporterFactory

__all__ = ["LLM"]


class LLM(engine_llm.EngineLLM):
    def __init__(self, model: str | Path, *, make_importer: ImporterFactory | None = None, **kwargs: Any) -> None:
        super().__init__(model, make_importer=make_importer, **kwargs)
        self.sessions = LMSessions(self.engine, SessionPort(self.engine))

    def open_session(
        self, sampling_params: SamplingParams | None = None, session_id: str | None = None,
        priority: int = PRIORITY_INTERACTIVE, cache_salt: str | None = None,
    ) -> Session:
        """Open an LM session (``session/lm/offline.py``): a long-lived context advanced step by
        step, with events, checkpoints, rollback and fork. ``sampling_params`` apply to every step
        (``seed`` seeds the session's own generator); ``priority``: the scheduling class of its
        steps (interactive by default, above batch requests). Raises ``SessionEventError``
        (``capacity`` beyond ``max_sessions``, ``invalid``)."""
        return Session(self.sessions, self.sessions.open(session_id, sampling_params, priority, cache_salt))

    def session(self, session_id: str) -> Session:
        """A handle of this LLM's session ``session_id`` (``not_found`` if it has none)."""
        return Session(self.sessions, self.sessions.runtime(session_id))
