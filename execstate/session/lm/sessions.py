"""The LM sessions of one engine: the API the offline ``Session`` and ``AsyncSessions`` call.

Engine thread only (or the offline caller's thread): every method runs between engine steps
(``session/runtime/sessions.py``: the LM kind serialises on that thread, no lock). An engine has
at most one ``LMSessions``, built explicitly by its owner and passed to whoever needs it: the
offline ``execstate.LLM`` holds its ``sessions`` (``session/lm/llm.py``), an ``AsyncSessions``
builds its own on the engine thread (``session/lm/async_sessions.py``). It installs its
manager's LRU eviction as the engine's block-holds reclaimer (KV pressure evicts an idle
session); a second ``LMSessions`` on the same engine raises ``ValueError``. The owner closes it
at shutdown (``close_all``). Options come from ``EngineConfig``:
``max_sessions`` (resident sessions), ``session_eviction`` (``None`` or ``"lru"``),
``max_session_events`` (pending events per session), ``max_session_checkpoints`` (live
checkpoints per session); a server adds its ``SessionPolicy`` (idle expiry, per-tenant quotas:
``session/runtime/manager.py``).

Ownership (``session/runtime/access.py``): every call takes the caller's ``Access`` (default
``LOCAL``: offline use) and resolves the session in the caller's namespace. Per-tenant KV: the
blocks a tenant's sessions pin (their state, checkpoints and origin, each session's distinct
blocks) are counted by :meth:`LMSessions.pinned_blocks`; a step, a fork or an import that could
take the tenant past its ``pinned_blocks`` quota is refused with ``quota`` before it starts.

Errors are :class:`SessionEventError` with a ``code``: ``invalid`` (bad argument, unknown kind,
bad payload, context too long), ``stale`` / ``backpressure`` (events), ``not_found`` (unknown
session or checkpoint id), ``busy`` (a step is in flight), ``failed`` (the session is FAILED:
only ``reset`` and ``close``), ``stale_state`` (the weights or provenance changed since the
session's state was computed: the session is FAILED; reset and step with ``reprefill=True``),
``capacity`` (too many sessions), ``quota`` (the tenant's quota), ``checkpoint_limit``,
``session_in_use`` (held by a live connection), ``evicted``, ``expired``, ``closed``.

Identity: each session records the execution identity (the engine's provenance, the session's
cache scope: its owner's tenant or shared group and its ``cache_salt``) its state was computed
under; a step after a weights update or any provenance change fails the session with
``stale_state`` unless the step asks ``reprefill=True``, which drops the blocks, the route rows
and the keys and recomputes the whole context under the new provenance.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.session_engine import SessionEngine
from execstate.engine.session_port import SessionPort
from execstate.engine.validation import validate_logit_bias, validate_sampling
from execstate.identity.scope import PrefixSharing
from execstate.identity.tenant import TenantId
from execstate.session.lm import tenancy
from execstate.session.lm.events import INPUT, lm_event_kinds
from execstate.session.lm.state import LMSaved, LMState
from execstate.session.lm.step import StepHandle, start_lm_step
from execstate.session.runtime.access import LOCAL, Access
from execstate.session.runtime.checkpoint import Checkpoint
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import SessionRuntime, SessionStatus
from execstate.session.runtime.manager import SessionManager, SessionPolicy
from execstate.session.runtime.sessions import KindSessions, runtime_fields
from execstate.state import host_memory


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    status: str
    step_index: int
    event_epoch: int
    branch_id: str
    num_tokens: int
    num_kv_tokens: int
    checkpoints: list[str]
    num_checkpoints: int
    last_event_id: int | None
    num_pending_events: int
    stepping: bool
    error: str | None
    state_key: str | None  # hex; None once the session ended


class LMSessions(KindSessions[SessionInfo]):
    """The LM kind's sessions object (module docstring); the shared operations (events,
    checkpoints, rollback, fork, reset, info) are ``KindSessions``'."""

    def __init__(self, engine: SessionEngine, port: SessionPort, policy: SessionPolicy | None = None,
                 sharing: PrefixSharing | None = None) -> None:
        """``engine``: as the LM kind reads it (``engine/session_engine.py``); ``port``: that
        engine's session port (``engine/session_port.py``); ``policy``: a server's bounds (None:
        ``max_session_checkpoints`` from the engine's config, no idle expiry, no quotas);
        ``sharing``: the operator's shared prefix groups (None: every tenant's sessions in its own
        cache partition)."""
        if engine.kv_holds.has_reclaimer:
            raise ValueError("this engine already has its LM sessions (its KV holds have an owner): pass that "
                             "LMSessions (or the AsyncSessions holding it) instead of building a second one")
        cfg = engine.config
        policy = policy or SessionPolicy(max_checkpoints=cfg.max_session_checkpoints)
        super().__init__(SessionManager(cfg.max_sessions, cfg.session_eviction, policy),
                         lm_event_kinds(engine.model_config.vocab_size, engine.max_model_len, engine.tokenizer),
                         cfg.max_session_events)
        self.engine = engine
        self.port = port  # the engine's blocks, steps and hand-overs, named (engine/session_port.py)
        self.sharing = sharing or PrefixSharing()
        self.steps: dict[SessionRuntime, StepHandle] = {}  # the step in flight of each session
        mc = engine.model_config
        self._route_shape = (mc.num_moe_layers, mc.top_k) if engine.return_routes else None
        engine.kv_holds.set_reclaimer(self.manager.reclaim)

    @classmethod
    def builder(cls, policy: SessionPolicy | None = None,
                sharing: PrefixSharing | None = None) -> Callable[[SessionEngine, SessionPort], LMSessions]:
        """How ``AsyncEngine.own_sessions`` builds an engine's sessions on its thread (``AsyncSessions``)."""
        return lambda engine, port: cls(engine, port, policy, sharing)

    # -- lifecycle --------------------------------------------------------------------------------
    def open(self, session_id: str | None = None, sampling_params: SamplingParams | None = None,
             priority: int = PRIORITY_INTERACTIVE, cache_salt: str | None = None,
             access: Access = LOCAL) -> SessionRuntime:
        """A new empty session of ``access``'s owner, held by its connection kind.
        ``sampling_params.seed`` seeds its generator (None: a seed drawn from the engine's
        generator, so ``LLM(seed=...)`` makes it reproducible)."""
        params = sampling_params or SamplingParams()
        if params.n != 1 or params.routed_experts is not None:
            raise SessionEventError("invalid", "a session samples one sequence (n=1) and routes freely")
        try:
            validate_sampling(params, self.engine.model_config.vocab_size)
            validate_logit_bias(params.logit_bias, self.engine.model_config.vocab_size)
        except ValueError as exc:
            raise SessionEventError("invalid", str(exc)) from None
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise SessionEventError("invalid", f"priority must be an int, got {priority!r}")
        try:  # every argument is checked before admission: a refusal evicts no other session
            scope = self.sharing.scope(access.owner.tenant, cache_salt)
        except ValueError as exc:
            raise SessionEventError("invalid", str(exc)) from None
        sid = self.manager.admit(session_id, access)
        seed = params.seed if params.seed is not None else int(
            torch.randint(0, 2**62, (1,), generator=self.engine.generator).item())
        state = LMState(self.engine.kv_holds, self.engine.block_size, self._route_shape, params, seed,
                        self.port.identity(scope), priority)
        return self.manager.add(SessionRuntime(sid, state, self.new_queue(), secrets.token_hex(8),
                                               owner=access.owner, holder=access.holder))

    def close(self, session_id: str, access: Access = LOCAL) -> bool:
        """Close (idempotent); a step in flight is cancelled first (its final output comes from
        the next engine step)."""
        rt = self.manager.get(session_id, access)
        handle = self.steps.get(rt)
        if handle is not None and not handle.done:
            self.port.abort_step(handle.request_id)
        held = tenancy.checkpoint_bytes(rt)
        released = super().close(session_id, access)
        if held >= host_memory.TRIM_AFTER_BYTES:
            host_memory.trim()  # its checkpoints' pages go back to the OS, not only to the allocator
        return released

    def expire_idle(self) -> list[str]:
        """``KindSessions.expire_idle``, then freed host memory goes back to the OS."""
        gone = super().expire_idle()
        if gone:
            host_memory.trim()
        return gone

    def fork(self, session_id: str, checkpoint: Checkpoint | str | None = None,
             new_session_id: str | None = None, access: Access = LOCAL) -> SessionRuntime:
        """``KindSessions.fork``; the fork's blocks count for the tenant (``quota`` past its pinned blocks)."""
        rt = self.manager.get(session_id, access)
        tenant = rt.owner.tenant
        self.manager.check_quota(tenant, "pinned_blocks", lambda: self.pinned_blocks(tenant),
                                 len(self._state(rt).block_ids()))
        return super().fork(session_id, checkpoint, new_session_id, access)

    def truncate(self, session_id: str, checkpoint: Checkpoint | str, num_tokens: int,
                 access: Access = LOCAL) -> None:
        """Roll back to ``checkpoint`` keeping the context's first ``num_tokens`` (at least the
        checkpoint's; the checkpoint on this context's branch), their KV held
        (``session/lm/state.py``): the session is as after the rollback and a step sending the
        kept tokens, none of them computed again. ``invalid`` (nothing changed) otherwise."""
        rt = self.manager.get(session_id, access)
        rt.require(SessionStatus.OPEN)
        cp = rt.resolve_checkpoint(checkpoint)
        state, saved = self._state(rt), cp.saved
        assert isinstance(saved, LMSaved)
        try:
            prefix = state.take_prefix(saved, num_tokens)
        except ValueError as exc:
            raise SessionEventError("invalid", str(exc)) from None
        try:
            rt.rollback(cp)
        except BaseException:
            state.drop_prefix(prefix)
            raise
        state.put_prefix(prefix)

    # -- events and steps -------------------------------------------------------------------------
    def start_step(self, session_id: str, input: list[int] | str | None = None, max_tokens: int | None = None,
                   reprefill: bool = False, stream: bool = False, access: Access = LOCAL) -> StepHandle:
        """Submit ``input`` (if any) as an ``input`` event with the next id, then start a step.
        The step runs as the engine steps; the returned handle is done when it finished."""
        rt = self.manager.get(session_id, access)
        rt.require(SessionStatus.OPEN)
        self._check_step_blocks(rt, input, max_tokens)
        if input is not None:
            rt.submit_event(rt.next_event_id(), INPUT, self._input_data(rt, input))
        state = rt.state
        assert isinstance(state, LMState)
        current = self.port.identity(state.identity.scope)
        if state.identity != current:
            if not reprefill and state.token_ids:  # an empty context has nothing computed: adopt the new root
                raise rt.fail("stale_state", "the engine's weights or provenance changed since this session's "
                              f"state was computed (weights version now {self.engine.provenance.weights_version}); "
                              "reset and step with reprefill=True, or close the session")
            state.reroot(current)
        handle = rt.begin_step(lambda drained: start_lm_step(
            self.port, rt, drained, max_tokens, stream, self.manager.tick))
        self.steps[rt] = handle
        handle.on_done.append(lambda h: self.steps.pop(rt, None) if self.steps.get(rt) is h else None)
        return handle

    def cancel(self, session_id: str, access: Access = LOCAL) -> bool:
        """Cancel the step in flight (its final output, ``finish_reason == "abort"``, comes from the
        next engine step); False if none is in flight."""
        handle = self.steps.get(self.manager.get(session_id, access))
        if handle is None or handle.done:
            return False
        return self.port.abort_step(handle.request_id)

    def _input_data(self, rt: SessionRuntime, input: list[int] | str) -> dict[str, Any]:
        if isinstance(input, str):
            return {"text": input, "add_special_tokens": self._first_input(rt)}
        return {"token_ids": input}

    def first_input(self, session_id: str, access: Access = LOCAL) -> bool:
        """Whether an input now would start the context: a shorthand text input then gets the
        tokenizer's special tokens, as ``LLM.generate("text")`` would."""
        return self._first_input(self.manager.get(session_id, access))

    def _first_input(self, rt: SessionRuntime) -> bool:
        state = rt.state
        assert isinstance(state, LMState)
        return not state.token_ids and not any(e.kind == INPUT for entry in rt.events.snapshot().pending for e in entry)

    def last_token(self, session_id: str, access: Access = LOCAL) -> int | None:
        """The context's last token id, ``None`` while it is empty (where a chat turn starts:
        ``chat.py``)."""
        state = self.manager.get(session_id, access).state
        assert isinstance(state, LMState)
        return state.token_ids[-1] if state.token_ids else None

    # -- state ------------------------------------------------------------------------------------
    def token_ids(self, session_id: str, access: Access = LOCAL) -> list[int]:
        """The context (a read: a hibernated session keeps its tokens and stays asleep)."""
        state = self.manager.get(session_id, access, wake=False).state
        assert isinstance(state, LMState)
        return list(state.token_ids)

    def routed_experts(self, session_id: str, access: Access = LOCAL) -> np.ndarray | None:
        """int16 ``[len(token_ids) - 1, n_moe_layers, top_k]`` (None without route return; a read)."""
        state = self.manager.get(session_id, access, wake=False).state
        assert isinstance(state, LMState)
        if state.routes is None:
            return None
        n = max(len(state.token_ids) - 1, 0)
        return state.routes.rows(0, n).copy()

    # -- per tenant --------------------------------------------------------------------------------
    def pinned_blocks(self, tenant: TenantId) -> int:
        """KV blocks ``tenant``'s resident sessions pin (``session/lm/tenancy.py``)."""
        return tenancy.pinned_blocks(self.manager, tenant)

    def usage(self) -> dict[TenantId, dict[str, Any]]:
        """Per tenant: sessions, agents, checkpoints, pinned blocks, checkpoint bytes (``/metrics``)."""
        return tenancy.usage(self.manager)

    def _check_step_blocks(self, rt: SessionRuntime, input: list[int] | str | None, max_tokens: int | None) -> None:
        tenant = rt.owner.tenant
        self.manager.check_quota(tenant, "pinned_blocks", lambda: self.pinned_blocks(tenant), tenancy.step_new_blocks(
            rt, input, max_tokens, self.engine.block_size, self.engine.max_model_len))

    @staticmethod
    def _state(rt: SessionRuntime) -> LMState:
        return tenancy.lm_state(rt)

    def describe(self, rt: SessionRuntime) -> SessionInfo:
        state = rt.state
        assert isinstance(state, LMState)
        return SessionInfo(**runtime_fields(rt), num_tokens=len(state.token_ids), num_kv_tokens=state.num_kv_tokens)
