"""A request's PD state (owned by ``engine/pd_connector.py`` and ``engine/pd_loads.py``).

Prefill side: ``params`` are the handoff parameters received with the request
(``{"do_remote_decode": true, ...}``), ``out`` the ones produced for the decode side (returned
in its final output). Decode side: ``handoff`` is the verified handoff to load the prompt's KV
from (None: nothing to load), ``load_started`` whether that load was started or skipped (a
request loads at most once, even when preempted), ``info`` the bytes and time of the load that
brought its KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from execstate.transfer.handoff import Handoff


@dataclass(eq=False)
class TransferState:
    params: dict[str, Any] | None = None
    out: dict[str, Any] | None = None
    handoff: Handoff | None = None
    load_started: bool = False
    info: dict[str, Any] | None = None
