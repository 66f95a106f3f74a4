"""``/v1/realtime/agent``: the agent WebSocket (messages: ``agent_protocol.py``; docs/agent-protocol.md).

Each connection drives one full-duplex agent (``agent/duplex.py``): the front is an LM session of
the served model (interactive priority), the back end is the server's tools (``agent_tools.py``)
plus the back-end model as the tool ``reason`` (``--agent-back-model``, else the served model at
batch priority), and any tools the client runs itself. ``/v1/realtime`` (LM sessions) is unchanged.

The transport is the realtime socket's (``realtime.py``): a reader queues frames, a processor
hands them one at a time to ``AgentConnection.handle``, a single writer sends (``Outbox``), with the
same abuse limits (1 MiB messages, 256 unprocessed messages, 1024 unsent events: a client that does
not read slows only its own agent, which stops with an ``overflow`` error past its event bound).
Several agents run at once, each in its own session; one connection's failure never reaches
another's. The API key and subprotocol are as for ``/v1/realtime``.

When the socket goes, the message being handled is finished, the rest dropped, and the agent is
closed: its front session released, its back-end tasks cancelled, or, if the client asked
(``keep_tasks_on_disconnect``), left to finish in the server's ``TaskKeeper`` (their results go
nowhere: an agent does not outlive its connection).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from fastapi import FastAPI
from starlette.websockets import WebSocket

from execstate.agent.backend import ModelTool
from execstate.agent.duplex import DuplexAgent
from execstate.agent.front import FrontModel, SessionFront
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.serve.agent_conn import AgentConnection
from execstate.serve.agent_tools import AgentTools
from execstate.serve.context import ServeContext
from execstate.serve.realtime import (
    MAX_UNSENT_EVENTS,
    SUBPROTOCOL,
    WRITER_DRAIN_S,
    Outbox,
    _Frame,
    _process,
    _read,
    _write,
)
from execstate.session.async_sessions import AsyncSessions

PATH = "/v1/realtime/agent"
BACK_MODEL_TOOL = "reason"
BACK_MODEL_MAX_TOKENS = 32

logger = logging.getLogger(__name__)


class TaskKeeper:
    """The server's back-end tool tasks: each runs to its end unless cancelled; ``running`` counts them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def running(self) -> int:
        return sum(not t.done() for t in self._tasks)


class AgentServer:
    """The agent endpoint of one app: the front's ``AsyncSessions``, the tools, the task keeper."""

    def __init__(self, ctx: ServeContext, back_engine: AsyncEngine | None = None,
                 tools: AgentTools | None = None) -> None:
        self.ctx = ctx
        self.engine = ctx.engine
        self.model_name = ctx.served_model_name
        self.sessions = AsyncSessions(ctx.engine)
        self.tools = tools or AgentTools()
        self.back_engine = back_engine or ctx.engine
        if self.back_engine.tokenizer is not None:
            self.tools.register(BACK_MODEL_TOOL, ModelTool(self.back_engine, max_tokens=BACK_MODEL_MAX_TOKENS))
        self.keeper = TaskKeeper()
        self.agents: dict[str, DuplexAgent] = {}  # live agents by front session id
        self.num_connections = 0

    async def open_front(self, instructions: str, params: SamplingParams) -> tuple[FrontModel, str]:
        """A front for a new agent: an LM session of the served model (interactive priority); (front, its id)."""
        front = await SessionFront.open(self.engine, instructions, params, sessions=self.sessions)
        return front, front.session_id

    async def endpoint(self, ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        self.num_connections += 1
        outbox = Outbox(MAX_UNSENT_EVENTS)
        conn = AgentConnection(self, outbox.put)
        inbox: asyncio.Queue[_Frame | None] = asyncio.Queue()
        pending = [0, 0]
        writer = asyncio.create_task(_write(ws, outbox))
        processor = asyncio.create_task(_process(conn, inbox, pending))  # type: ignore[arg-type]
        try:
            await _read(ws, inbox, pending, outbox)
        finally:
            await asyncio.shield(self._end(conn, inbox, processor, outbox, writer))

    async def _end(self, conn: AgentConnection, inbox: asyncio.Queue[_Frame | None], processor: asyncio.Task[None],
                   outbox: Outbox, writer: asyncio.Task[None]) -> None:
        conn.disconnected()
        inbox.put_nowait(None)
        await asyncio.wait({processor})
        try:
            await conn.close()
        except Exception:  # noqa: BLE001 - a failed close must not keep the connection counted
            logger.exception("agent: closing the agent of a dropped connection failed")
        await outbox.finish()
        try:
            await asyncio.wait_for(writer, WRITER_DRAIN_S)
        except TimeoutError:
            logger.debug("agent: the client did not read its last events")
        self.num_connections -= 1


def install_agent(app: FastAPI, ctx: ServeContext, back_engine: AsyncEngine | None = None) -> AgentServer:
    """Serve ``/v1/realtime/agent`` on ``app`` (``app.state.agent`` is the ``AgentServer``; register
    tools on ``app.state.agent.tools``)."""
    server = AgentServer(ctx, back_engine)
    app.state.agent = server
    app.add_api_websocket_route(PATH, server.endpoint)
    return server
