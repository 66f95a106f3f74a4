"""The handlers of ``/v1/voice/realtime`` (one ``VoiceAgent`` per connection) and ``/agent``.

The framework (``serve/realtime/``) decodes each frame, checks the phase (``messages.py``), calls
the handler here, one message at a time in arrival order, and turns what a handler raises into an
``error`` event. Contract:

- The session exists from the connection on: ``session.created`` is the first event (sent by
  ``start``, which the framework has no hook for: the handlers schedule it when they are built,
  and every handler waits for it). Settings can change with ``session.update`` at any time;
  ``instructions`` only until the agent is opened, which happens at the first message that needs it
  (audio, a commit, a response), so a client's first ``session.update`` shapes the front.
- The agent is a ``VoiceAgent`` over a ``DuplexAgent`` whose front is an LM session of the served
  model (interactive priority), whose back end is the server's tools (the agent endpoint's
  registry: calculator, lookup, reason, and registered ones), delegated by the server's rules
  (``VoiceServer.rules``: never a client's regex). Its events are forwarded by a pump task
  (``convert.events_json``).
- Blocking work never runs here: audio decoding from base64 is bounded (1 MiB a message); VAD,
  recognition, synthesis and resampling run on the agent's worker threads (``voice/agent.py``).
- ``close()`` (the socket gone) closes the agent: front released, tasks cancelled.
- The model: a client names it in the URL (``?model=``, what the SDK's ``realtime.connect(model=...)``
  sends) and may in ``session.model``; it must be the served model (the front), else the socket
  gets one ``error`` ``model_not_found`` naming the served model and is closed (1008), or the
  ``session.update`` is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from starlette.websockets import WebSocket

from execstate.agent import end_probe
from execstate.agent.agent_events import ErrorEvent
from execstate.agent.backend import Backend, TaskLimits
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import RegexPolicy, Rule
from execstate.agent.duplex import DuplexAgent
from execstate.agent.end_probe import EndProbe
from execstate.agent.front import DEFAULT_FRONT_PARAMS, SessionFront
from execstate.agent.prefill import PrefillStats
from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.serve.auth import public_paths
from execstate.serve.context import ServeContext
from execstate.serve.key_script import install_key_script
from execstate.serve.realtime.connection import Handler, Peer
from execstate.serve.realtime.endpoint import Endpoint
from execstate.serve.realtime.errors import SERVER_ERROR, ProtocolError, error_event
from execstate.serve.realtime.limits import CLOSE_POLICY_VIOLATION
from execstate.serve.realtime.voice.convert import (
    EventIds,
    decode_audio,
    events_json,
    invalid,
    session_json,
    voice_config,
)
from execstate.serve.realtime.voice.messages import (
    END,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    VOICE_PROTOCOL,
    AudioAppend,
    AudioClear,
    AudioCommit,
    ItemCreate,
    ItemTruncate,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
)
from execstate.session.runtime.access import AGENTS, Access, Owner
from execstate.voice.agent import VoiceAgent, VoiceConfig
from execstate.voice.engines import VoiceEngines

PATH = "/v1/voice/realtime"  # the SDK's websocket_base_url: ws://HOST/v1/voice
PAGE_PATH = "/agent"
VOICE_HOLDER = "voice"  # the holder of a voice agent's front (no other connection can resume it)
DEFAULT_INSTRUCTIONS = "A helpful voice assistant talks with a user."
DEFAULT_RULES = (Rule(r"(?P<expression>\d+ (?:times|plus|minus|divided by) \d+)", "calculator"),
                 Rule(r"code of (?P<key>[a-z]+)", "lookup", ack="One moment."))
STOPPING = ("front_failed", "overflow")

logger = logging.getLogger(__name__)


class VoiceServer:
    """The voice endpoint of one app: engines (built on first use), tools, rules, the endpoint."""

    def __init__(self, ctx: ServeContext, tools: Callable[[], Mapping[str, Callable[..., Any]]],
                 engines: Callable[[], VoiceEngines], rules: tuple[Rule, ...] = DEFAULT_RULES,
                 agent_config: AgentConfig | None = None, task_limits: TaskLimits | None = None) -> None:
        self.ctx, self.tools, self.rules = ctx, tools, rules
        self.task_limits = task_limits or TaskLimits()
        self._make_engines = engines
        self._engines: VoiceEngines | None = None
        self.agent_config = agent_config or AgentConfig(max_response_tokens=48)
        self.front_params = DEFAULT_FRONT_PARAMS  # the front's sampling (an embedding app may change it)
        self.agents: dict[str, VoiceAgent] = {}
        self.prefill = PrefillStats()  # the speculative prefill of the agents closed so far
        self.probe: EndProbe | None = None  # the end-of-turn probe the agents score with (end_probe())
        self._probe_for: tuple[str, str] | None = None  # (end_score, weights_version) it was selected for
        self.endpoint = Endpoint(VOICE_PROTOCOL, lambda peer: VoiceHandlers(peer, self))

    def check_model(self, model: str | None) -> str | None:
        """None if ``model`` (absent or the served name) selects the front, else why not."""
        name = self.ctx.served_model_name
        if model is None or model == name:
            return None
        return (f"the model {model[:MAX_NAME_CHARS]!r} is not served here; the voice front is {name!r} "
                f"(connect with model={name!r})")

    async def serve(self, ws: WebSocket) -> None:
        """The route: the URL's model checked, then the protocol's socket loop."""
        refusal = self.check_model(ws.query_params.get("model"))
        if refusal is None:
            await self.endpoint.serve(ws)
            return
        offered = ws.scope.get("subprotocols") or []
        sub = VOICE_PROTOCOL.subprotocol
        await ws.accept(subprotocol=sub if sub in offered else None)
        await ws.send_text(json.dumps(error_event("model_not_found", refusal, None)))
        await ws.close(CLOSE_POLICY_VIOLATION, "model_not_found")

    async def end_probe(self) -> EndProbe | None:
        """The end-of-turn probe the agents will score with (``agent/end_probe.select`` on
        ``agent_config.end_score`` and the engine's weights; None: the end tokens' mass), which
        sets ``semantic_vad``'s thresholds."""
        key = (self.agent_config.end_score, await self.ctx.engine.weights_version())
        if key != self._probe_for:
            self.probe, self._probe_for = end_probe.select(*key), key
        return self.probe

    def engines(self) -> VoiceEngines:
        if self._engines is None:
            self._engines = self._make_engines()
        return self._engines

    async def open_agent(self, instructions: str, cfg: VoiceConfig,
                         tenant: TenantId = LOCAL_TENANT) -> tuple[VoiceAgent, str]:
        """A voice agent of ``tenant``: its front is an LM session in the tenant's ``agents`` realm
        (never visible to the session API or ``/v1/realtime``; counted in the tenant's ``agents``
        quota, which refuses it with ``quota``), its back end bounded by ``task_limits``."""
        engines = await asyncio.to_thread(self.engines)  # the first build loads models: off the loop
        ctx = self.ctx
        access = Access(Owner(tenant, AGENTS), VOICE_HOLDER)
        front = await SessionFront.open(ctx.engine, instructions, self.front_params,
                                        sessions=ctx.sessions.scoped(access))
        tools = dict(self.tools())
        policy = RegexPolicy([r for r in self.rules if r.tool in tools])
        agent = DuplexAgent(front, Backend(tools, self.task_limits), policy, self.agent_config)
        va = VoiceAgent(agent, engines.recognizer, engines.synthesizer, engines.detector(), cfg)
        await va.start()
        return va, front.session_id


class VoiceHandlers:
    def __init__(self, peer: Peer, server: VoiceServer) -> None:
        self.peer, self.emit, self.state, self.server = peer, peer.emit, peer.state, server
        self.sid = f"sess_{uuid.uuid4().hex[:16]}"
        self.cfg = VoiceConfig(in_rate=24000, out_rate=24000)
        self.instructions = DEFAULT_INSTRUCTIONS
        self.va: VoiceAgent | None = None
        self.ids = EventIds()
        self._lock = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None
        self._started = asyncio.get_running_loop().create_task(self._start())
        self.routes: dict[type, Handler] = {
            SessionUpdate: self._update, AudioAppend: self._append, AudioCommit: self._commit, AudioClear: self._clear,
            ResponseCreate: self._create, ResponseCancel: self._cancel, ItemTruncate: self._truncate,
            ItemCreate: self._item}

    async def _start(self) -> None:
        self.state.values["session_id"] = self.sid
        try:
            engines = await asyncio.to_thread(self.server.engines)
            self.cfg = VoiceConfig(in_rate=24000, out_rate=24000, voice=engines.voice)
        except Exception as exc:  # noqa: BLE001 - the audio packages are missing: said once, then session_ended
            self.state.move(END)
            await self.peer.emit_error(ProtocolError("voice_unavailable", f"voice engines unavailable: {exc}", None,
                                                     SERVER_ERROR))
            return
        await self.emit({"type": "session.created", "event_id": self.ids(), "session": self._session()})

    async def close(self) -> None:
        self._started.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._started
        if self.va is not None:
            self.server.agents.pop(self.sid, None)
            await self.va.close()
            self.server.prefill.add(self.va.agent.prefill.stats)
            if self._pump is not None:
                with contextlib.suppress(Exception):
                    await self._pump

    # -- messages ----------------------------------------------------------------------------------
    async def _update(self, msg: SessionUpdate) -> None:
        await self._started
        s = msg.session
        cfg = voice_config(s, self.cfg, set(self.server.engines().voices), await self.server.end_probe())
        refusal = self.server.check_model(s.model)
        if refusal is not None:
            raise ProtocolError("model_not_found", f"session.model: {refusal}", msg.event_id)
        if s.instructions is not None and s.instructions != self.instructions:
            if self.va is not None:
                raise invalid("session.instructions are fixed once the agent started (after the first audio)")
            self.instructions = s.instructions
        if self.va is not None:
            await self.va.update(cfg)
        self.cfg = cfg
        await self.emit({"type": "session.updated", "event_id": self.ids(), "session": self._session()})

    async def _append(self, msg: AudioAppend) -> None:
        data = decode_audio(msg.audio)
        va = await self._agent()
        await va.append(np.frombuffer(data, dtype="<i2").astype(np.int16))

    async def _commit(self, msg: AudioCommit) -> None:
        va = await self._agent()
        if va.config.vad is not None:
            raise invalid("input_audio_buffer.commit: server_vad commits by itself (set turn_detection null)")
        if await va.commit() is None:
            raise ProtocolError("input_audio_buffer_commit_empty", "the input audio buffer is empty", msg.event_id)

    async def _clear(self, msg: AudioClear) -> None:
        await (await self._agent()).clear()

    async def _create(self, msg: ResponseCreate) -> None:
        if msg.response:
            raise invalid("response.create: per-response settings are not served; send response.create {}")
        (await self._agent()).create_response()

    async def _cancel(self, msg: ResponseCancel) -> None:
        va = await self._agent()
        if not va.cancel():
            raise ProtocolError("response_cancel_not_active", "no response is generating or playing", msg.event_id)

    async def _item(self, msg: ItemCreate) -> None:
        it = msg.item
        if it.type != "message" or it.role != "user" or not it.content or any(
                p.type != "input_text" or not p.text for p in it.content):
            raise invalid("conversation.item.create: only a user message of input_text parts with text")
        text = " ".join(p.text for p in it.content if p.text)
        if len(text) > MAX_TEXT_CHARS or (it.id is not None and len(it.id) > MAX_NAME_CHARS):
            raise invalid(f"conversation.item.create: the text is at most {MAX_TEXT_CHARS} characters")
        (await self._agent()).add_text(text, it.id)

    async def _truncate(self, msg: ItemTruncate) -> None:
        if msg.content_index != 0:
            raise invalid(f"content_index: a reply has one audio part (0), got {msg.content_index}")
        (await self._agent()).truncate(msg.item_id, msg.audio_end_ms)

    # -- helpers -------------------------------------------------------------------------------------
    async def _agent(self) -> VoiceAgent:
        await self._started
        async with self._lock:
            if self.va is None:
                self.va, _front_id = await self.server.open_agent(self.instructions, self.cfg, self.peer.tenant)
                self.server.agents[self.sid] = self.va
                self._pump = asyncio.create_task(self._forward(self.va), name=f"voice-pump:{self.sid}")
            return self.va

    async def _forward(self, va: VoiceAgent) -> None:
        transcripts: dict[str, str] = {}
        try:
            async for ev in va.events():
                for wire in events_json(ev, self.ids, transcripts):
                    await self.emit(wire)
                if isinstance(ev, ErrorEvent) and ev.code in STOPPING:
                    self.state.move(END)
        except Exception as e:  # a bug: the client is told, the agent stops, the server goes on
            logger.exception("voice: forwarding an event failed")
            self.state.move(END)
            await self.peer.emit_error(ProtocolError("server_error", f"internal error: {e!r}", None, SERVER_ERROR))

    def _session(self) -> dict[str, Any]:
        return session_json(self.sid, self.server.ctx.served_model_name, self.instructions, self.cfg,
                            self.server.probe)


def install_voice(app: FastAPI, ctx: ServeContext, tools: Callable[[], Mapping[str, Callable[..., Any]]],
                  engines: Callable[[], VoiceEngines], task_limits: TaskLimits | None = None) -> VoiceServer:
    """Serve ``/v1/voice/realtime`` and the ``/agent`` page (``app.state.voice``). ``tools``: the
    server tools by name (read when an agent opens); ``engines``: builds the engines (on first use)."""
    server = VoiceServer(ctx, tools, engines, task_limits=task_limits)
    app.state.voice = server
    app.add_api_websocket_route(PATH, server.serve)
    static = resources.files("execstate.serve").joinpath("static")
    files = {"": ("agent.html", "text/html"), ".js": ("agent.js", "text/javascript"),
             "-worklet.js": ("agent-worklet.js", "text/javascript")}
    for suffix, (name, media) in files.items():
        body = static.joinpath(name).read_text()

        async def page(body: str = body, media: str = media) -> Response:
            return HTMLResponse(body) if media == "text/html" else Response(body, media_type=media)

        app.add_api_route(PAGE_PATH + suffix, page, methods=["GET"], include_in_schema=False)
        public_paths(app).add(PAGE_PATH + suffix)  # the page asks for the key (key_script.py)
    install_key_script(app)
    return server
