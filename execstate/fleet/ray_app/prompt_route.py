"""What the ingress tells the router about one HTTP request (a :class:`RouteRequest`).

- ``POST /v1/completions``: the first prompt's token ids, as the replica will compute them (the
  same ``completion_prompts`` conversion as ``serve/openai/``), and the cache scope the replica
  will key them under: the caller's tenant (its API key, looked up in the fleet's key ring) under
  the fleet's shared prefix groups, with the body's ``cache_salt``;
- ``POST /v1/chat/completions``: the chat template applied (``chat_prompt``), and the same scope;
- ``/v1/sessions/{id}...``: the replica holding the session (from the ingress's
  :class:`SessionOwners`);
- anything else, or a body the conversion refuses: no tokens (power of two; the replica that gets
  it answers the error itself).

Runs off the event loop (tokenising). Imports no Ray.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any, NamedTuple

from execstate.engine.tokenizer import Tokenizer
from execstate.fleet.router.policy import RouteRequest
from execstate.identity.scope import PrefixSharing
from execstate.identity.tenant import LOCAL_TENANT, TenantId
from execstate.serve.errors import OpenAIError
from execstate.serve.openai.convert import chat_prompt, completion_prompts
from execstate.serve.openai.protocol import ChatCompletionRequest, CompletionRequest

SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)(?:/.*)?$")
NOT_SESSION_IDS = ("import",)  # /v1/sessions/import...: the signed hand-over paths, not a session
MAX_SESSIONS = 100_000


def caller_of(authorization: str | None) -> str:
    """A digest of the caller's credential: session ids are per tenant, so the owner map is keyed
    by (caller, id); the credential itself is never kept."""
    return hashlib.sha256((authorization or "").encode()).hexdigest()[:16]


class Held(NamedTuple):
    """Where a session lives: its replica, the ``Authorization`` header it was opened with (a drain
    or a resume presents it to a replica: it never leaves the fleet), the engine id of that
    replica (its manifest key in the shared tier: ``engine id:tenant:session id``) and the tenant
    (None: unknown)."""

    replica_id: str
    authorization: str | None = None
    engine_id: str | None = None
    tenant: str | None = None


class SessionOwners:
    """Session -> where it is held (:class:`Held`), for sessions opened or moved through this
    ingress (bounded: the least recently used entries are forgotten beyond ``MAX_SESSIONS``)."""

    def __init__(self, capacity: int = MAX_SESSIONS) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[tuple[str, str], Held] = OrderedDict()

    def get(self, caller: str, session_id: str) -> str | None:
        held = self.held(caller, session_id)
        return held.replica_id if held is not None else None

    def held(self, caller: str, session_id: str) -> Held | None:
        key = (caller, session_id)
        owner = self._owners.get(key)
        if owner is not None:
            self._owners.move_to_end(key)
        return owner

    def set(self, caller: str, session_id: str, replica_id: str, authorization: str | None = None, *,
            engine_id: str | None = None, tenant: str | None = None) -> None:
        """Record (or move) the session to ``replica_id`` (whose engine is ``engine_id``); the
        authorization and tenant already known are kept when not given."""
        old = self._owners.get((caller, session_id))
        auth = authorization if authorization is not None or old is None else old.authorization
        ten = tenant if tenant is not None or old is None else old.tenant
        self._owners[(caller, session_id)] = Held(replica_id, auth, engine_id, ten)
        self._owners.move_to_end((caller, session_id))
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def drop(self, caller: str, session_id: str) -> None:
        self._owners.pop((caller, session_id), None)

    def held_by(self, replica_id: str) -> list[tuple[str, str, str | None]]:
        """(caller, session id, authorization) of every session ``replica_id`` holds."""
        return [(c, sid, h.authorization) for (c, sid), h in self._owners.items() if h.replica_id == replica_id]


def session_of(path: str) -> str | None:
    m = SESSION_PATH.match(path)
    if m is None or m.group(1) in NOT_SESSION_IDS:
        return None
    return m.group(1)


def prompt_route(method: str, path: str, body: bytes, tokenizer: Tokenizer | None,
                 max_model_len: int | None = None, tenant: TenantId | None = LOCAL_TENANT,
                 sharing: PrefixSharing | None = None) -> RouteRequest:
    """The route of a prompt-carrying request (module docstring); ``RouteRequest()`` otherwise, and
    for a caller without a tenant (a wrong key: the replica refuses it) or a bad salt."""
    if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions") or tenant is None:
        return RouteRequest()
    try:
        raw: Any = json.loads(body or b"null")
        if not isinstance(raw, dict):
            return RouteRequest()
        scope = (sharing or PrefixSharing()).scope(tenant, raw.get("cache_salt"))  # ValueError: the replica says why
        if path == "/v1/completions":
            prompts = completion_prompts(CompletionRequest.model_validate(raw), tokenizer, max_model_len)
            return RouteRequest(tuple(prompts[0].token_ids), scope) if prompts else RouteRequest()
        prompt = chat_prompt(ChatCompletionRequest.model_validate(raw), tokenizer, max_model_len)
        return RouteRequest(tuple(prompt.token_ids), scope)
    except (ValueError, TypeError, OpenAIError):  # the replica answers the error
        return RouteRequest()
