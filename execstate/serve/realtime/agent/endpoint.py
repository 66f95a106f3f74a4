"""``/v1/realtime/agent``: the agent WebSocket (messages: ``messages.py``; docs/agent-protocol.md).

Each connection drives one full-duplex agent (``agent/duplex.py``): the front is an LM session of
the served model (interactive priority), the back end is the server's tools (``tools.py``)
plus the back-end model as the tool ``reason`` (``--agent-back-model``, else the served model at
batch priority), and any tools the client runs itself. ``/v1/realtime`` (LM sessions) is unchanged.

The socket loop is the framework's (``serve/realtime/``), with ``/v1/realtime``'s limits (1 MiB
messages, 256 unprocessed messages, 1024 unsent events: a client that does not read slows only its
own agent, which stops with an ``overflow`` error past its event bound). Each agent runs at most
``task_limits.max_tasks`` back-end tasks at once, each for at most ``task_limits.timeout_s``
(``--agent-max-tasks``, ``--agent-tool-timeout-s``). Several agents run at
once, each in its own session; one connection's failure never reaches another's. The API key and
subprotocol are as for ``/v1/realtime``.

Ownership: an agent's front is an LM session of the connection's tenant in the ``agents`` realm
(``session/runtime/access.py``), held by the ``agent`` kind of connection: it counts against the
tenant's ``agents`` quota, and neither the session API nor ``/v1/realtime`` can reach it (its id is
``not_found`` there). The back-end model's tasks are short sessions in the ``tasks`` realm.

When the socket goes, the message being handled is finished, the rest dropped, and the agent is
closed: its front session released, its back-end tasks cancelled, or, if the client asked
(``keep_tasks_on_disconnect``), left to finish in the server's ``TaskKeeper`` (their results go
nowhere: an agent does not outlive its connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from fastapi import FastAPI

from execstate.agent.backend import ModelTool, TaskLimits
from execstate.agent.duplex import DuplexAgent
from execstate.agent.front import FrontModel, SessionFront
from execstate.agent.tool_threads import ToolThreads
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.serve.context import ServeContext
from execstate.serve.realtime.agent.handlers import AgentHandlers
from execstate.serve.realtime.agent.messages import AGENT_PROTOCOL
from execstate.serve.realtime.agent.tools import AgentTools
from execstate.serve.realtime.connection import Peer
from execstate.serve.realtime.endpoint import Endpoint, mount
from execstate.session.runtime.access import AGENTS, TASKS, Access, Owner

PATH = "/v1/realtime/agent"
BACK_MODEL_TOOL = "reason"
BACK_MODEL_MAX_TOKENS = 32
AGENT_HOLDER = "agent"


TOOL_WORKERS = 8


class TaskKeeper:
    """The server's back-end tool tasks: each runs to its end unless cancelled; ``running`` counts them.
    Sync tools run on ``workers``, the tools' own daemon threads (``TOOL_WORKERS`` at once;
    ``agent/tool_threads.py``): a tool that hangs past its timeout keeps its slot, and only tools
    wait for slots, never the sessions' tokenising or the world's encoding (asyncio's default pool)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.workers = ToolThreads(TOOL_WORKERS)

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
                 tools: AgentTools | None = None, task_limits: TaskLimits | None = None) -> None:
        self.ctx = ctx
        self.task_limits = task_limits or TaskLimits()
        self.engine = ctx.engine
        self.model_name = ctx.served_model_name
        self.sessions = ctx.sessions
        self.tools = tools or AgentTools()
        self.back_engine = back_engine or ctx.engine
        if self.back_engine.tokenizer is not None:
            tasks = Access(Owner(LOCAL_TENANT, TASKS))
            self.tools.register(BACK_MODEL_TOOL, ModelTool(
                self.back_engine, max_tokens=BACK_MODEL_MAX_TOKENS,
                sessions=ctx.sessions.scoped(tasks) if self.back_engine is ctx.engine else None))
        self.keeper = TaskKeeper()
        self.agents: dict[str, DuplexAgent] = {}  # live agents by front session id
        self.endpoint = Endpoint(AGENT_PROTOCOL, self.handlers)

    async def open_front(self, instructions: str, params: SamplingParams,
                         tenant: TenantId = LOCAL_TENANT) -> tuple[FrontModel, str]:
        """A front for a new agent of ``tenant``: an LM session of the served model (interactive
        priority) in the ``agents`` realm; (front, its id). ``quota`` past the tenant's agents."""
        access = Access(Owner(tenant, AGENTS), AGENT_HOLDER)
        front = await SessionFront.open(self.engine, instructions, params, sessions=self.sessions.scoped(access))
        return front, front.session_id

    def handlers(self, peer: Peer) -> AgentHandlers:
        """The handlers of one new connection."""
        return AgentHandlers(peer, self)

    @property
    def num_connections(self) -> int:
        return self.endpoint.num_connections


def install_agent(app: FastAPI, ctx: ServeContext, back_engine: AsyncEngine | None = None,
                  task_limits: TaskLimits | None = None) -> AgentServer:
    """Serve ``/v1/realtime/agent`` on ``app`` (``app.state.agent`` is the ``AgentServer``; register
    tools on ``app.state.agent.tools``). ``task_limits``: each agent's back-end bounds (a tool's
    timeout, tasks at once; ``agent/backend.py``)."""
    server = AgentServer(ctx, back_engine, task_limits=task_limits)
    app.state.agent = server
    mount(app, PATH, server.endpoint)
    return server
