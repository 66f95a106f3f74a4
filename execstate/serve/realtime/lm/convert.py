"""Realtime messages <-> session calls: client JSON -> engine inputs, session results -> server events.

Inbound (each bad value raises ``SessionEventError("invalid", ...)`` naming it, before any
engine work): ``session_params`` (``session.create``'s ``sampling`` and ``max_tokens`` ->
``SamplingParams``: vLLM field names; JSON's string keys of ``logit_bias`` become token ids),
``event_data`` (the same key conversion inside ``sampling`` events, also as composite parts),
``step_input`` (``response.create``'s ``input``: token ids, text or chat messages).

Outbound: every server event is a plain dict (the framework's ``server_event``) whose ``event_id``
is the id of the client message it answers (``None`` for ``response.delta``); ``session_json`` is
a ``SessionInfo``; ``response_json`` the ``response`` object of ``response.created`` /
``response.done`` (``done_json``). Route rows travel as base64 of ``numpy.save`` bytes, as over
HTTP (``serve/route_rows.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from execstate.engine.outputs import Logprob
from execstate.engine.priority import PRIORITY_BATCH, PRIORITY_INTERACTIVE
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.scope import cache_salt
from execstate.serve.realtime.lm.messages import SessionConfig
from execstate.session.lm.chat import ChatTurn
from execstate.session.lm.events import SAMPLING, SAMPLING_FIELDS
from execstate.session.lm.sessions import SessionInfo
from execstate.session.lm.step import StepResult
from execstate.session.runtime.events import COMPOSITE, SessionEventError

SESSION_SAMPLING_FIELDS = SAMPLING_FIELDS | {"seed"}
PRIORITIES = (PRIORITY_BATCH, PRIORITY_INTERACTIVE)


def invalid(message: str) -> SessionEventError:
    return SessionEventError("invalid", message)


# -- inbound ------------------------------------------------------------------------------------------
def session_params(cfg: SessionConfig) -> SamplingParams:
    """The session's ``SamplingParams`` from ``session.create``'s ``session`` object."""
    unknown = sorted(set(cfg.sampling) - SESSION_SAMPLING_FIELDS)
    if unknown:
        raise invalid(f"session.sampling: unknown or fixed field(s) {unknown}; allowed: "
                      f"{sorted(SESSION_SAMPLING_FIELDS)}")
    data = _json_sampling(cfg.sampling)
    if cfg.max_tokens is not None:
        if "max_tokens" in data:
            raise invalid("give max_tokens once: session.max_tokens or session.sampling.max_tokens")
        data["max_tokens"] = cfg.max_tokens
    try:
        return dataclasses.replace(SamplingParams(), **data)
    except (ValueError, TypeError) as exc:
        raise invalid(f"session.sampling: {exc}") from None


def session_options(cfg: SessionConfig) -> tuple[int, str | None]:
    """(priority, cache_salt) of ``session.create``."""
    priority = PRIORITY_INTERACTIVE if cfg.priority is None else cfg.priority
    if isinstance(priority, bool) or priority not in PRIORITIES:
        raise invalid(f"session.priority must be {PRIORITY_INTERACTIVE} (interactive) or {PRIORITY_BATCH} (batch), "
                      f"got {cfg.priority!r}")
    try:
        return priority, cache_salt(cfg.cache_salt)
    except ValueError as exc:
        raise invalid(f"session.{exc}") from None


def event_data(kind: Any, data: Any) -> Any:
    """An ``event.submit`` payload as the session's validators expect it (JSON keys converted)."""
    if kind == SAMPLING and isinstance(data, Mapping):
        return _json_sampling(data)
    if kind == COMPOSITE and isinstance(data, Mapping) and isinstance(data.get("events"), list):
        parts = [{**p, "data": event_data(p.get("kind"), p.get("data"))} if isinstance(p, Mapping) else p
                 for p in data["events"]]
        return {**data, "events": parts}
    return data


def step_input(value: dict[str, Any] | None) -> list[int] | str | ChatTurn | None:
    """``response.create``'s ``input``: ``{"token_ids": [...]}``, ``{"text": "..."}`` or
    ``{"messages": [{"role", "content"}, ...]}`` (a chat turn: ``session/lm/chat.py``), or absent."""
    if value is None:
        return None
    if set(value) == {"token_ids"} and isinstance(value["token_ids"], list):
        return value["token_ids"]
    if set(value) == {"text"} and isinstance(value["text"], str):
        return value["text"]
    if set(value) == {"messages"} and isinstance(value["messages"], list):
        return ChatTurn(value["messages"])
    raise invalid("response.create.input must be {\"token_ids\": [int, ...]}, {\"text\": \"...\"} or "
                  "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]}; submit other inputs with event.submit")


def _json_sampling(data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(data)
    bias = out.get("logit_bias")
    if isinstance(bias, Mapping):
        try:
            out["logit_bias"] = {int(k): v for k, v in bias.items()}
        except (TypeError, ValueError):
            raise invalid("logit_bias keys must be token ids (integers, as strings in JSON)") from None
    return out


# -- outbound -----------------------------------------------------------------------------------------
def session_json(info: SessionInfo, return_routes: bool, checkpoints: bool = False) -> dict[str, Any]:
    """The ``session`` object; it lists the session's checkpoint ids only when ``checkpoints``
    (``session.info``, ``session.created``, ``session.resumed``, ``session.forked``): the replies
    to ``session.checkpoint``, ``session.rollback``, ``session.reset`` name what changed
    (``checkpoint_id``) and the count (``num_checkpoints``), not every id again."""
    out = dataclasses.asdict(info)
    if not checkpoints:
        del out["checkpoints"]
    out["return_routes"] = return_routes
    return out


def response_json(response_id: str, session_id: str, status: str, step_index: int,
                  events: dict[str, list[int]]) -> dict[str, Any]:
    """The ``response`` object of ``response.created`` (``response.done`` adds the outcome)."""
    return {"id": response_id, "session_id": session_id, "status": status, "step_index": step_index,
            "events": events}


def done_json(response_id: str, session_id: str, step_index: int, events: dict[str, list[int]],
              result: StepResult | None, token_ids: list[int], text: str, error: SessionEventError | None,
              routes: str | None, want_routes: bool) -> dict[str, Any]:
    """The ``response`` object of ``response.done``: the step's metadata, or for a step that ended
    without a result (failed, or its session closed: ``cancelled``), what was delivered."""
    if result is not None:
        status = "cancelled" if result.finish_reason == "abort" else "completed"
    else:
        status = "cancelled" if error is not None and error.code == "closed" else "failed"
        error = None if status == "cancelled" else error
    out = response_json(response_id, session_id, status, step_index, events)
    if result is not None:
        out.update({
            "events": result.events, "token_ids": result.token_ids, "text": result.text,
            "finish_reason": result.finish_reason, "stop_reason": result.stop_reason,
            "num_computed_tokens": result.num_computed_tokens, "num_cached_tokens": result.num_cached_tokens,
        })
        if result.logprobs is not None:
            out["logprobs"] = [_logprobs_json(entry) for entry in result.logprobs]
            out["cumulative_logprob"] = result.cumulative_logprob
    else:
        out.update({"token_ids": token_ids, "text": text, "finish_reason": "abort", "stop_reason": None,
                    "num_computed_tokens": None, "num_cached_tokens": None})
    if want_routes:
        out["routed_experts"] = routes
    out["error"] = None if error is None else {"code": error.code, "message": error.message}
    return out


def _logprobs_json(entry: dict[int, Logprob]) -> list[dict[str, Any]]:
    """One token's logprobs, most likely first: ``[{"token_id", "logprob", "rank", "token"}]``."""
    items = sorted(entry.items(), key=lambda kv: kv[1].rank)
    return [{"token_id": t, "logprob": lp.logprob, "rank": lp.rank, "token": lp.decoded_token} for t, lp in items]
