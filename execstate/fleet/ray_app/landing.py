"""The fleet's landing page at ``/``: what the fleet serves and where everything is.

The ingress answers ``GET /`` itself (no replica is asked): the single server's page
(``serve/landing.py``, the same look) with the fleet's rows, rendered on each request from what the
ingress knows then (replicas register as they start, and leave when drained or lost):

- the model the replicas serve, the fleet's shape (``N`` engine replicas, or ``P`` prefill and
  ``D`` decode replicas) and each registered replica (id, role, weights version, draining);
- the endpoints: the OpenAI API, sessions and the realtime WebSockets through the ingress, the
  fleet's own operations (``/v1/fleet/...``, ``fleet_ops.py``);
- the docs site at ``/docs/`` when one was built in the checkout (``make docs``).

On a keyed fleet (``--api-keys-file``) the page is public, as a browser navigating to it cannot
send a key, so it names no model and no replica: only the fleet's shape, where a caller with a key
finds the models (``GET /v1/models``), the endpoints and the docs. No script, nothing from the
request on the page.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from execstate.fleet.ray_app.ws_route import WS_PATHS
from execstate.serve.landing import KEYED_MODELS_ROW, page_html

FLEET_ENDPOINTS: list[tuple[str, str, str]] = [
    ("POST /v1/completions, /v1/chat/completions",
     "the OpenAI-compatible API, each request on the replica whose cache holds the most of its prompt "
     "(execution-compatible blocks), load and session affinity", ""),
    ("GET /v1/models", "the served model (a replica answers)", "/v1/models"),
    ("/v1/sessions", "the HTTP session API: a session's requests go to the replica that holds it", ""),
    *[(f"WS {path}", "a realtime WebSocket, proxied to one replica", "") for path in WS_PATHS],
    ("GET /v1/fleet/replicas", "the replicas, their requests and the sessions resumed after a loss",
     "/v1/fleet/replicas"),
    ("POST /v1/fleet/drain, /v1/fleet/update_weights",
     "take a replica out of service (its sessions migrate); a rolling weight update", ""),
    ("GET /metrics, /health", "one replica's metrics and liveness", ""),
]


def render_fleet_page(model: str, replicas: dict[str, dict[str, Any]], draining: set[str], keyed: bool,
                      docs: bool) -> str:
    """The page (module docstring): ``replicas`` as registered with the ingress (id -> info with
    ``role`` and ``weights_version``), ``draining`` their ids taken out of service, ``keyed``: the
    fleet asks for API keys; ``docs``: a docs site is served at ``/docs/``."""
    shape = fleet_shape(replicas)
    if keyed:  # the shape, and where a caller with a key finds the models
        return page_html([("fleet", shape), KEYED_MODELS_ROW], FLEET_ENDPOINTS, docs)
    rows = [("language model", model), ("fleet", shape)]
    for rid in sorted(replicas):
        info = replicas[rid]
        parts = [str(info.get("role") or "engine")]
        if info.get("weights_version"):
            parts.append(f"weights {str(info['weights_version'])[:16]}")
        if rid in draining:
            parts.append("draining")
        rows.append((f"replica {rid}", ", ".join(parts)))
    return page_html(rows, FLEET_ENDPOINTS, docs)


def fleet_shape(replicas: dict[str, dict[str, Any]]) -> str:
    """The replicas registered, by role: "2 engine replicas", "1 prefill and 2 decode replicas"."""
    if not replicas:
        return "no replica registered yet (each registers as it starts), on Ray Serve"
    roles = Counter(str(info.get("role") or "engine") for info in replicas.values())
    counts = " and ".join(f"{n} {role}" for role, n in sorted(roles.items(), key=lambda r: _ORDER.get(r[0], 9)))
    return f"{counts} replica{'s' if sum(roles.values()) > 1 else ''}, on Ray Serve"


_ORDER = {"engine": 0, "prefill": 1, "decode": 2}
