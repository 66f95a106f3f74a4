"""Who owns a session and who asks (docs/security.md): the namespace session ids resolve in, and holds.

Every session records its :class:`Owner`: the tenant that created it (``identity/tenant.py``) and
the *realm* it lives in, the surface that names it:

- ``sessions``: LM sessions of the session API (``/v1/sessions...``) and ``/v1/realtime``;
- ``agents``: the front sessions of ``/v1/realtime/agent`` agents;
- ``tasks``: the short-lived sessions of agents' back-end model tasks;
- ``world``: world sessions (``/v1/realtime/video``).

Every call on a session names an :class:`Access`: the owner it asks as, and the live connection
(``holder``) it comes from, if any. The session manager (``manager.py``) resolves an id only
within the asking owner's namespace, so

- another tenant's session is ``not_found`` (never "forbidden": ids are not confirmed), and two
  tenants may both have a session ``demo``;
- an agent's front or a world session is ``not_found`` through the LM session API (another realm);
- a session *held* by a live connection (``holder`` set: created, forked or resumed over
  ``/v1/realtime``) refuses every call that does not come through a holder of the same kind,
  reads included, with ``session_in_use``: the HTTP API (``holder`` None) cannot read or change
  what a WebSocket client drives. Which connection of the holder's kind may drive it is the
  holder's own business (``serve/realtime/lm/owners.py``).

Offline use (``execstate.LLM``, ``execstate.World``) is :data:`LOCAL`: the local tenant, the
``sessions`` realm, no holder.
"""

from __future__ import annotations

from dataclasses import dataclass

from execstate.identity.tenant import LOCAL_TENANT, TenantId

SESSIONS = "sessions"
AGENTS = "agents"
TASKS = "tasks"
WORLD = "world"
REALMS = (SESSIONS, AGENTS, TASKS, WORLD)


@dataclass(frozen=True)
class Owner:
    """The tenant that created a session and the realm that names it."""

    tenant: TenantId = LOCAL_TENANT
    realm: str = SESSIONS

    def __post_init__(self) -> None:
        if self.realm not in REALMS:
            raise ValueError(f"unknown session realm {self.realm!r}; realms: {', '.join(REALMS)}")


@dataclass(frozen=True)
class Access:
    """Who asks: as ``owner``, from a live connection of kind ``holder`` (None: a detached caller)."""

    owner: Owner = Owner()
    holder: str | None = None

    @property
    def tenant(self) -> TenantId:
        return self.owner.tenant

    def as_realm(self, realm: str) -> Access:
        """The same tenant and holder in another realm (an agent's front, a world session)."""
        return Access(Owner(self.owner.tenant, realm), self.holder)


LOCAL = Access()
"""Offline use: the local tenant, the ``sessions`` realm, no holder."""
