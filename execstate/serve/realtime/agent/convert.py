"""Agent messages <-> agent values: client settings -> ``AgentConfig`` / policy / sampling, agent
events -> server events (plain dicts; docs/agent-protocol.md).

Inbound (each bad value raises ``SessionEventError("invalid", ...)`` naming it, before any engine
work): ``agent_config`` (the settings over a base config: creation or update), ``delegation_policy``
(``RegexPolicy`` from the rules; the tools must be enabled), ``front_params`` (sampling over the
front's defaults).

Outbound: ``event_json`` turns an ``AgentEvent`` into the server event (``event_id`` None: the
agent's own clock produced it); ``session_json`` the ``session`` object of ``session.created`` /
``session.updated``. A response's status (``completed``, ``cancelled``, ``failed``) is the runtime's,
as is (OpenAI's names).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import msgspec

from execstate.agent.agent_events import (
    AgentEvent,
    DelegationCreated,
    DelegationResult,
    ErrorEvent,
    OutputDelta,
    ResponseCreated,
    ResponseDone,
    TurnEvent,
)
from execstate.agent.config import AgentConfig
from execstate.agent.delegation import Match, RegexPolicy, Rule, compile_pattern
from execstate.agent.front import DEFAULT_FRONT_PARAMS
from execstate.agent.turn_policy import TurnConfig
from execstate.engine.sampling_params import SamplingParams
from execstate.serve.realtime.agent.messages import AgentSessionConfig, DelegationSettings
from execstate.serve.realtime.errors import error_event
from execstate.serve.realtime.messages import server_event
from execstate.session.runtime.events import SessionEventError

FRONT_SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k", "min_p", "seed"})
MAX_STEP_TOKENS = 64
MAX_RESPONSE_TOKENS = 1024
MAX_RULES = 32
MAX_PATTERN_CHARS = 256
MAX_TEXT_CHARS = 2048  # instructions, acknowledgements, templates
CONFIG_FIELDS = ("step_tokens", "max_response_tokens", "speak_results", "result_template", "model_tool_calls",
                 "cancel_tasks_on_barge_in", "chars_per_s")


def invalid(message: str) -> SessionEventError:
    return SessionEventError("invalid", message)


# -- inbound ------------------------------------------------------------------------------------------
def agent_config(s: AgentSessionConfig, base: AgentConfig) -> AgentConfig:
    """``base`` with the settings ``s`` gives (absent ones kept)."""
    changes: dict[str, Any] = {k: getattr(s, k) for k in CONFIG_FIELDS if getattr(s, k) is not None}
    for name, top in (("step_tokens", MAX_STEP_TOKENS), ("max_response_tokens", MAX_RESPONSE_TOKENS)):
        v = changes.get(name)
        if v is not None and v > top:
            raise invalid(f"session.{name} is at most {top}, got {v}")
    if "chars_per_s" in changes and not math.isfinite(changes["chars_per_s"]):
        raise invalid("session.chars_per_s must be finite")
    if len(changes.get("result_template") or "") > MAX_TEXT_CHARS:
        raise invalid(f"session.result_template is at most {MAX_TEXT_CHARS} characters")
    if "result_template" in changes:
        _check_format(changes["result_template"], "result_template", {"result"})
    try:
        if s.turn is not None:
            turn = {k: v for k, v in msgspec.structs.asdict(s.turn).items() if v is not msgspec.UNSET}
            for k in ("end_of_turn_silence_s", "resume_after_s", "final_silence_s"):
                if turn.get(k) is not None and not math.isfinite(turn[k]):
                    raise invalid(f"session.turn.{k} must be finite")
            changes["turn"] = dataclasses.replace(base.turn, **turn)
        return dataclasses.replace(base, **changes)
    except (ValueError, TypeError) as exc:
        raise invalid(f"session: {exc}") from None


def _check_format(text: str, name: str, allowed: set[str]) -> None:
    try:
        text.format(**{k: "" for k in allowed})
    except (KeyError, IndexError, ValueError) as exc:
        raise invalid(f"session.{name}: only the placeholders {sorted(allowed)} are allowed ({exc!r})") from None


def delegation_policy(d: DelegationSettings, tools: set[str]) -> RegexPolicy:
    if len(d.rules) > MAX_RULES:
        raise invalid(f"session.delegation.rules: at most {MAX_RULES} rules, got {len(d.rules)}")
    rules = []
    for i, r in enumerate(d.rules):
        where = f"session.delegation.rules[{i}]"
        if r.tool not in tools:
            raise invalid(f"{where}.tool: {r.tool!r} is not an enabled tool; enabled: {sorted(tools)}")
        if not r.pattern or len(r.pattern) > MAX_PATTERN_CHARS:
            raise invalid(f"{where}.pattern must be 1-{MAX_PATTERN_CHARS} characters")
        try:
            compile_pattern(r.pattern)
        except ValueError as exc:
            raise invalid(f"{where}.pattern: {exc}") from None
        if len(r.ack or "") > MAX_TEXT_CHARS:
            raise invalid(f"{where}.ack is at most {MAX_TEXT_CHARS} characters")
        rules.append(Rule(r.pattern, r.tool, _arguments(dict(r.arguments)), r.ack))
    if len(d.ack or "") > MAX_TEXT_CHARS:
        raise invalid(f"session.delegation.ack is at most {MAX_TEXT_CHARS} characters")
    return RegexPolicy(rules) if d.ack is None else RegexPolicy(rules, ack=d.ack)


def _arguments(fixed: dict[str, Any]) -> Callable[[Match], dict[str, Any]]:
    def arguments(m: Match) -> dict[str, Any]:
        return {**fixed, **{k: v for k, v in m.groupdict().items() if v is not None}}

    return arguments


def front_params(sampling: dict[str, Any] | None) -> SamplingParams:
    """The front's sampling: its defaults (greedy, a reply ends at a newline) with ``sampling`` over them."""
    data = dict(sampling or {})
    unknown = sorted(set(data) - FRONT_SAMPLING_FIELDS)
    if unknown:
        raise invalid(
            f"session.sampling: unknown or fixed field(s) {unknown}; allowed: {sorted(FRONT_SAMPLING_FIELDS)}"
        )
    try:
        return dataclasses.replace(DEFAULT_FRONT_PARAMS, **data)
    except (ValueError, TypeError) as exc:
        raise invalid(f"session.sampling: {exc}") from None


def check_instructions(text: str | None) -> None:
    if text is not None and len(text) > MAX_TEXT_CHARS:
        raise invalid(f"session.instructions is at most {MAX_TEXT_CHARS} characters")


# -- outbound -----------------------------------------------------------------------------------------
def session_json(session_id: str, model: str, cfg: AgentConfig, tools: dict[str, str],
                 rules: list[dict[str, Any]], keep_tasks: bool) -> dict[str, Any]:
    """``tools``: name -> runner (``server`` or ``client``)."""
    turn: TurnConfig = cfg.turn
    return {
        "id": session_id, "object": "realtime.agent_session", "model": model,
        "tools": [{"name": n, "runner": r} for n, r in sorted(tools.items())],
        "turn": dataclasses.asdict(turn),
        "delegation": {"rules": rules},
        **{k: getattr(cfg, k) for k in CONFIG_FIELDS},
        "keep_tasks_on_disconnect": keep_tasks,
    }


def event_json(ev: AgentEvent, runners: dict[str, str]) -> dict[str, Any]:
    """The server event for an agent event (``runners``: tool name -> ``server`` / ``client``)."""
    common = {"t": round(ev.t, 6), "epoch": ev.epoch}
    if isinstance(ev, OutputDelta):
        return server_event(ev.type, None, response_id=ev.response_id, item_id=ev.response_id, delta=ev.text, **common)
    if isinstance(ev, TurnEvent):
        return server_event(ev.type, None, kind=ev.kind, text=ev.text, **common)
    if isinstance(ev, ResponseCreated):
        return server_event(ev.type, None, response={"id": ev.response_id, "status": "in_progress",
                                                     "cause": ev.cause}, **common)
    if isinstance(ev, ResponseDone):
        return server_event(ev.type, None, response={
            "id": ev.response_id, "status": ev.status, "status_details": {"reason": ev.reason},
            "output_text": ev.text}, **common)
    if isinstance(ev, DelegationCreated):
        return server_event(ev.type, None, delegation_id=ev.delegation_id, call_id=ev.delegation_id, tool=ev.tool,
                            arguments=dict(ev.arguments), source=ev.source, runner=runners.get(ev.tool, "server"),
                            **common)
    if isinstance(ev, DelegationResult):
        return server_event(ev.type, None, delegation_id=ev.delegation_id, status=ev.status, result=ev.result,
                            error=ev.error, appended=ev.appended, **common)
    if isinstance(ev, ErrorEvent):
        kind = "server_error" if ev.code == "front_failed" else "agent_error"
        return {**error_event(ev.code, ev.message, None, kind), **common}
    raise TypeError(f"unknown agent event {type(ev).__name__}")
