"""The handlers of ``/v1/realtime/agent`` (one full-duplex ``DuplexAgent`` per connection).

The framework (``serve/realtime/connection.py``) decodes each frame, checks the phase
(``messages.py``'s ``PHASES``), calls the message's handler here, in arrival order and one at a
time, and turns what a handler raises into an ``error`` event (an agent's ledger errors with
their wire codes: ``messages.py``'s ``ERRORS``). Contract:

- A message is acted on at once (``feed``, ``cancel``, ``truncate`` ... take effect in the agent's
  state before its handler returns); the agent's own events (turns, responses, deltas,
  delegations) are forwarded by a *pump* task as the agent produces them, each followed for a
  ``response.done`` by a ``usage`` event. Acknowledgements carry the client's ``event_id``;
  every refusal is an ``error`` with a code, the ``event_id`` and a message naming the problem.
- Server tools run as tasks the server's ``TaskKeeper`` holds (``endpoint.py``; sync ones on its
  threads), each bounded by the server's ``TaskLimits`` (a timeout, tasks at once): cancelling a
  delegation cancels its task, unless the agent is being closed with its tasks kept
  (``keep_tasks_on_disconnect`` on a disconnect, ``session.close`` with ``cancel_tasks: false``):
  then the task runs on, detached, and its result goes nowhere. Client tools' delegations are
  cancelled whenever the agent closes (no one is left to answer them).
- ``close()`` (after the last message, the socket gone) closes the agent: its front session is
  released, its response in flight cancelled, its back-end tasks cancelled or kept as asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from concurrent.futures import Executor
from typing import Any

import msgspec

from execstate.agent.agent_events import ErrorEvent, ResponseDone
from execstate.agent.backend import Backend
from execstate.agent.config import AgentConfig
from execstate.agent.duplex import DuplexAgent
from execstate.agent.ledger import DelegationState
from execstate.serve.realtime.agent.convert import (
    agent_config,
    check_instructions,
    delegation_policy,
    event_json,
    front_params,
    invalid,
    session_json,
)
from execstate.serve.realtime.agent.messages import (
    CLOSE,
    END,
    FIXED_FIELDS,
    OPEN,
    AgentSessionConfig,
    DelegationCancel,
    DelegationResultSubmit,
    InputAppend,
    ItemCreate,
    ItemTruncate,
    ResponseCancel,
    SessionClose,
    SessionCreate,
    SessionUpdate,
)
from execstate.serve.realtime.connection import Handler, Peer
from execstate.serve.realtime.errors import SERVER_ERROR, ProtocolError
from execstate.serve.realtime.messages import server_event

DEFAULT_INSTRUCTIONS = "A helpful voice assistant talks with a user."
STOPPING = ("front_failed", "overflow")  # agent errors after which the agent has stopped

logger = logging.getLogger(__name__)


class AgentHandlers:
    def __init__(self, peer: Peer, server: Any) -> None:
        """``server``: the ``AgentServer`` (``open_front``, ``tools``, ``keeper``, ``task_limits``, ``agents``,
        ``model_name``)."""
        self.peer = peer
        self.emit = peer.emit
        self.state = peer.state
        self.server = server
        self.agent: DuplexAgent | None = None
        self.runners: dict[str, str] = {}  # enabled tool -> "server" | "client"
        self.rules: list[dict[str, Any]] = []
        self.keep_tasks = False
        self._detaching = False
        self._pump: asyncio.Task[None] | None = None
        self.routes: dict[type, Handler] = {
            SessionCreate: self._create, SessionUpdate: self._update, SessionClose: self._close,
            InputAppend: self._append, ResponseCancel: self._cancel, ItemTruncate: self._truncate,
            DelegationCancel: self._cancel_delegation, DelegationResultSubmit: self._submit, ItemCreate: self._submit,
        }

    async def close(self) -> None:
        """The socket is gone: close the agent, keeping its tasks if the client asked."""
        if self.agent is not None:
            await self._shutdown(cancel_tasks=not self.keep_tasks)

    # -- sessions -----------------------------------------------------------------------------------
    async def _create(self, msg: SessionCreate) -> None:
        s = msg.session
        server_tools = self.server.tools.tools
        enabled = sorted(server_tools) if s.tools is None else list(dict.fromkeys(s.tools))
        unknown = sorted(set(enabled) - set(server_tools))
        if unknown:
            raise invalid(f"session.tools: unknown tool(s) {unknown}; the server has {sorted(server_tools)}")
        runners = {name: "server" for name in enabled}
        for ct in s.client_tools or []:
            if ct.name in runners or ct.name in server_tools:
                raise invalid(f"session.client_tools: {ct.name!r} is already a tool (server tools: "
                              f"{sorted(server_tools)}); give each tool one name")
            runners[ct.name] = "client"
        check_instructions(s.instructions)
        cfg = agent_config(s, AgentConfig())
        policy = delegation_policy(s.delegation, set(runners)) if s.delegation is not None else None
        params = front_params(s.sampling)
        tools = {n: self._server_tool(server_tools[n]) if r == "server" else _client_tool for n, r in runners.items()}
        front, sid = await self.server.open_front(s.instructions or DEFAULT_INSTRUCTIONS, params, self.peer.tenant)
        agent = DuplexAgent(front, Backend(tools, self.server.task_limits), policy, cfg)
        await agent.start()
        self.agent, self.runners, self.keep_tasks = agent, runners, bool(s.keep_tasks_on_disconnect)
        self.rules = _rules_json(s)
        self.state.move(OPEN, session_id=sid)
        self.server.agents[sid] = agent
        await self.emit(server_event("session.created", msg.event_id, session=self._session_json()))
        self._pump = asyncio.create_task(self._forward(agent), name=f"agent-pump:{sid}")

    async def _update(self, msg: SessionUpdate) -> None:
        agent, s = self._agent(), msg.session
        fixed = [f for f in FIXED_FIELDS if getattr(s, f) is not None]
        if fixed:
            raise invalid(f"session.update cannot change {fixed}: they are fixed at session.create")
        cfg = agent_config(s, agent.config)
        policy = delegation_policy(s.delegation, set(self.runners)) if s.delegation is not None else agent.policy
        agent.config, agent.turns.config, agent.policy = cfg, cfg.turn, policy
        if s.delegation is not None:
            self.rules = _rules_json(s)
        if s.keep_tasks_on_disconnect is not None:
            self.keep_tasks = s.keep_tasks_on_disconnect
        await self.emit(server_event("session.updated", msg.event_id, session=self._session_json()))

    async def _close(self, msg: SessionClose) -> None:
        sid = self.state.values["session_id"]
        await self._shutdown(msg.cancel_tasks)
        await self.emit(server_event("session.closed", msg.event_id, session_id=sid))

    async def _shutdown(self, cancel_tasks: bool) -> None:
        """Close the agent: the front released, client-tool delegations cancelled, server tasks
        cancelled or detached; every event it still emits forwarded before this returns."""
        agent, self.agent = self._agent(), None
        self.server.agents.pop(self.state.values["session_id"], None)
        for did in agent.ledger.open_ids():
            if self.runners.get(agent.ledger.get(did).tool) == "client":
                agent.cancel_delegation(did)
        self._detaching = not cancel_tasks
        await agent.close(cancel_tasks=True)  # detached tasks survive the cancel (``_server_tool``)
        if self._pump is not None:
            await self._pump
            self._pump = None
        self.state.move(CLOSE)

    # -- input and responses --------------------------------------------------------------------------
    async def _append(self, msg: InputAppend) -> None:
        if msg.t is not None and not (math.isfinite(msg.t) and msg.t >= 0):
            raise invalid(f"t must be a finite number of seconds >= 0, got {msg.t!r}")
        agent = self._agent()
        # Input cannot arrive in the past: a t before the agent's clock (network delay, a client
        # clock behind the server's) is taken as now; a later t moves the agent's clock forward.
        agent.feed(msg.text, None if msg.t is None else max(msg.t, agent.now()))

    async def _cancel(self, msg: ResponseCancel) -> None:
        agent = self._agent()
        current = agent.fence.current
        if msg.response_id is not None and (current is None or current.response_id != msg.response_id):
            raise ProtocolError("no_response", f"response.cancel: {msg.response_id!r} is not the response in "
                                "flight", msg.event_id)
        before = set(agent.ledger.open_ids())
        active = agent.cancel(cancel_tasks=msg.cancel_tasks)
        await self._emit_cancelled(before - set(agent.ledger.open_ids()), msg.event_id)
        if not active:
            raise ProtocolError("no_response", "response.cancel: no response is in flight"
                                + (" (open back-end tasks were cancelled)" if before else ""), msg.event_id)

    async def _truncate(self, msg: ItemTruncate) -> None:
        if msg.content_index != 0:
            raise invalid(f"content_index: an agent reply has one text part (0), got {msg.content_index}")
        if msg.audio_end_ms is not None and not (math.isfinite(msg.audio_end_ms) and msg.audio_end_ms >= 0):
            raise invalid(f"audio_end_ms must be a finite number >= 0, got {msg.audio_end_ms!r}")
        kept = self._agent().truncate(msg.item_id, msg.played_chars, msg.audio_end_ms)
        pos = {"audio_end_ms": msg.audio_end_ms} if msg.audio_end_ms is not None else {"played_chars": msg.played_chars}
        await self.emit(server_event("conversation.item.truncated", msg.event_id, item_id=msg.item_id,
                                     content_index=0, **pos, kept_tokens=kept))

    # -- delegations ------------------------------------------------------------------------------------
    async def _cancel_delegation(self, msg: DelegationCancel) -> None:
        agent = self._agent()
        if not agent.cancel_delegation(msg.delegation_id):
            state = agent.ledger.get(msg.delegation_id).state.value
            raise ProtocolError("not_open", f"delegation {msg.delegation_id!r} is already {state}", msg.event_id)
        await self._emit_cancelled({msg.delegation_id}, msg.event_id)

    async def _submit(self, msg: DelegationResultSubmit | ItemCreate) -> None:
        agent = self._agent()
        did, output = (msg.delegation_id, msg.output) if isinstance(msg, DelegationResultSubmit) else (
            msg.item.call_id, msg.item.output)
        d = agent.ledger.get(did)
        if self.runners.get(d.tool) != "client":
            raise ProtocolError("not_client_tool", f"delegation {did!r} runs the server tool {d.tool!r}; only a "
                                "client tool's result can be submitted", msg.event_id)
        agent.deliver_result(did, output)
        agent.backend.cancel(d.delegation_id)  # the placeholder task waiting for the client
        if isinstance(msg, ItemCreate):
            await self.emit(server_event("conversation.item.created", msg.event_id, item={
                "id": did, "type": "function_call_output", "call_id": did, "output": output}))
        else:
            await self.emit(server_event("delegation.result.accepted", msg.event_id, delegation_id=did))

    async def _emit_cancelled(self, ids: AbstractSet[str], event_id: Any) -> None:
        agent = self._agent()
        for did in sorted(ids):
            if agent.ledger.get(did).state is DelegationState.CANCELLED:
                await self.emit(server_event("delegation.cancelled", event_id, delegation_id=did))

    # -- helpers ------------------------------------------------------------------------------------------
    async def _forward(self, agent: DuplexAgent) -> None:
        """The pump: every agent event to the client, in order, until the agent is closed."""
        try:
            async for ev in agent.events():
                await self.emit(event_json(ev, self.runners))
                if isinstance(ev, ResponseDone):
                    r = agent.fence.responses.get(ev.response_id)
                    await self.emit(server_event("usage", None, response_id=ev.response_id,
                                                 output_tokens=len(r.token_ids) if r is not None else 0,
                                                 context_tokens=len(agent.transcript.token_ids)))
                elif isinstance(ev, ErrorEvent) and ev.code in STOPPING:
                    self.state.move(END)
        except Exception as e:  # a bug: the client is told, the agent stops, the server goes on
            logger.exception("agent: forwarding an event failed")
            self.state.move(END)
            await self.peer.emit_error(ProtocolError("server_error", f"internal error: {e!r}", None, SERVER_ERROR))
            with contextlib.suppress(Exception):
                await agent.close(cancel_tasks=not self.keep_tasks)

    def _server_tool(self, fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        keeper = self.server.keeper

        async def run(**arguments: Any) -> Any:
            task = keeper.spawn(_call(fn, arguments, keeper.workers))
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if not self._detaching:
                    task.cancel()
                raise

        return run

    def _agent(self) -> DuplexAgent:
        assert self.agent is not None  # check() let the message through
        return self.agent

    def _session_json(self) -> dict[str, Any]:
        agent = self._agent()
        sid = self.state.values["session_id"]
        assert sid is not None
        return session_json(sid, self.server.model_name, agent.config, self.runners, self.rules,
                            self.keep_tasks)


async def _call(fn: Callable[..., Any], arguments: dict[str, Any], workers: Executor) -> Any:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        return await fn(**arguments)
    return await asyncio.get_running_loop().run_in_executor(workers, functools.partial(fn, **arguments))


async def _client_tool(**arguments: Any) -> str:
    """A client tool's back-end task: it waits for the client's result (then it is cancelled)."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")


def _rules_json(s: AgentSessionConfig) -> list[dict[str, Any]]:
    d = s.delegation
    if d is None:
        return []
    return [msgspec.structs.asdict(r) for r in d.rules]
