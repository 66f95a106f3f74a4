"""The offline LM session API (``execstate.LLM.open_session``, ``session/lm/llm.py``), one call per operation::

    s = llm.open_session(sampling_params=SamplingParams(temperature=0.8, seed=1))
    r = s.step([1, 2, 3] or "text", max_tokens=16)    # -> StepResult
    r = s.step(messages=[{"role": "user", "content": "Hello"}])   # a chat turn (session/lm/chat.py)
    s.token_ids, s.routed_experts                       # the whole context, its route rows
    s.submit_event(event_id=7, kind="input", data={"token_ids": [4, 5]})   # applied at the next step
    cp = s.checkpoint(); s.rollback(cp); f = s.fork(cp)  # fork(None): at the current step
    s.reset(); s.close()
    s2 = s.migrate(other_llm)                            # session/lm/migration.py; s is closed then
    s.hibernate(); s.wake()     # session/lm/hibernation.py: KV to the tiers, pool blocks released;
                                # any later call (step, event, checkpoint...) wakes it too

``step`` drives ``engine.step()`` until the step's request finished; other requests in the engine
progress in the same steps (their outputs go to ``on_output`` when given). A refused call raises
:class:`SessionEventError` (``.code``: see ``session/lm/sessions.py``); a failed step raises it
with code ``failed`` and leaves the session FAILED (only ``reset`` and ``close`` work then).
Rules of the state machine, checkpoints and forks: ``session/runtime/lifecycle.py``; of events:
``session/runtime/events.py`` and ``session/lm/events.py``.

A ``Session`` is also a context manager that closes it. Not thread-safe (like ``LLM``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from execstate.engine.outputs import RequestOutput
from execstate.session.lm.chat import turn_tokens
from execstate.session.lm.hibernation import hibernate, wake
from execstate.session.lm.sessions import LMSessions, SessionInfo
from execstate.session.lm.step import StepResult
from execstate.session.runtime.checkpoint import Checkpoint
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.handle import SessionHandle

__all__ = ["Checkpoint", "Session", "SessionEventError", "StepResult"]


class Session(SessionHandle):
    """An LM session (``LLM.open_session``): the shared handle (``session/runtime/handle.py``) plus
    the context's tokens and routes, ``step`` and ``migrate``."""

    _sessions: LMSessions

    # -- state ------------------------------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        """The whole context so far (inputs and outputs, in order)."""
        return self._sessions.token_ids(self.session_id, self.access)

    @property
    def routed_experts(self) -> np.ndarray | None:
        """int16 ``[len(token_ids) - 1, n_moe_layers, top_k]`` (vLLM layout); None without R3."""
        return self._sessions.routed_experts(self.session_id, self.access)

    def info(self) -> SessionInfo:
        return self._sessions.info(self.session_id, self.access)

    # -- operations --------------------------------------------------------------------------------
    def truncate(self, checkpoint: Checkpoint | str, num_tokens: int) -> None:
        """Back to ``checkpoint``, keeping the context's first ``num_tokens`` with their KV
        (``LMSessions.truncate``)."""
        self._sessions.truncate(self.session_id, checkpoint, num_tokens, self.access)

    def step(self, input: list[int] | str | None = None, max_tokens: int | None = None, reprefill: bool = False,
             on_output: Callable[[RequestOutput], None] | None = None,
             messages: list[dict[str, Any]] | None = None) -> StepResult:
        """Append ``input`` (an ``input`` event with the next id) and the pending events, then
        generate up to ``max_tokens`` tokens (None: the session's ``SamplingParams.max_tokens``).
        ``messages`` instead of ``input``: a chat turn, ``[{"role": "user", "content": "Hello"}]``,
        rendered with the model's chat template one turn at a time (``session/lm/chat.py``: the
        context stays what ``LLM.chat`` over the whole conversation would prompt with)."""
        if messages is not None:
            if input is not None:
                raise SessionEventError("invalid", "give input or messages, not both")
            try:
                input = turn_tokens(
                    self._sessions.engine.tokenizer, messages, self._sessions.last_token(self.session_id, self.access)
                )
            except ValueError as exc:
                raise SessionEventError("invalid", f"messages: {exc}") from None
        handle = self._sessions.start_step(self.session_id, input, max_tokens, reprefill, access=self.access)
        engine = self._sessions.engine
        while not handle.done:
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"the engine lost step {handle.step_index} of session {self.session_id!r}")
            for out in engine.step():
                if out.request_id != handle.request_id and on_output is not None:
                    on_output(out)
        if handle.error is not None:
            raise handle.error
        assert handle.result is not None
        return handle.result

    def hibernate(self) -> SessionInfo:
        """Sleep: the session's blocks go to the offload tiers as units, its control state to a
        manifest (published to the shared tier, if any, once its units are written), and it
        releases every pool block (``session/lm/hibernation.py``). The next call wakes it."""
        record = hibernate(self._sessions, self.session_id, self.access)
        conn = self._sessions.engine.offload
        if not record.published:
            record.publish(conn.flush if conn is not None else None)
        return self.info()

    def wake(self) -> SessionInfo:
        """Wake now (any other call would too); its next step reloads or recomputes the KV."""
        wake(self._sessions, self.session_id, self.access)
        return self.info()

    def migrate(self, target: Any, timeout_s: float = 30.0) -> Session:
        """Move this session to ``target`` (an ``execstate.LLM`` or the ``LMSessions`` of an engine
        in this process; both engines need PD connectors: ``session/lm/migration.py``) and return
        its handle there (same id); this one is closed. ``MigrationError`` leaves this session as it
        was, serving."""
        from execstate.session.lm.migration import migrate_session

        return cast(Session, migrate_session(self, target, timeout_s).session)  # type(self) on the target
