"""The worlds one server serves, by name: ``session.create``'s ``model`` picks one.

``execstate serve --world world,maze`` serves the grid world and the first-person maze side by side
on one ``/v1/realtime/video``: each is a :class:`WorldHost` (its model, its sessions' runtime, its
limits), a session runs on the one its ``session.create`` names (vLLM-Omni's ``model`` field), the
first listed when it names none. An unknown name is refused (``model_not_found``, listing the
names). The per-server limits (``--world-max-sessions``, ``--world-session-memory``) apply to each
world; a tenant's ``world_sessions`` count is the sum over the worlds (``/metrics``).
"""

from __future__ import annotations

from collections.abc import Iterable

from execstate.identity.tenant import TenantId
from execstate.serve.realtime.errors import EventId, ProtocolError
from execstate.serve.realtime.world.host import WorldHost


class WorldHosts:
    def __init__(self, hosts: Iterable[WorldHost]) -> None:
        self.hosts: dict[str, WorldHost] = {}
        for h in hosts:
            if h.model_name in self.hosts:
                raise ValueError(f"world {h.model_name!r} is listed twice")
            self.hosts[h.model_name] = h
        if not self.hosts:
            raise ValueError("a server serves at least one world")

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    @property
    def default(self) -> WorldHost:
        return next(iter(self.hosts.values()))

    def pick(self, name: str | None, event_id: EventId = None) -> WorldHost:
        """The world ``name`` (None: the default), or ``ProtocolError`` ``model_not_found``."""
        if name is None:
            return self.default
        if name not in self.hosts:
            raise ProtocolError("model_not_found", f"this server serves the worlds {self.names}, not {name!r}",
                                event_id)
        return self.hosts[name]

    def usage(self) -> dict[TenantId, int]:
        """World sessions resident per tenant, over every world (``/metrics``)."""
        out: dict[TenantId, int] = {}
        for h in self.hosts.values():
            for tenant, n in h.usage().items():
                out[tenant] = out.get(tenant, 0) + n
        return out

    @property
    def num_sessions(self) -> int:
        return sum(h.num_sessions for h in self.hosts.values())

    def shutdown(self) -> None:
        for h in self.hosts.values():
            h.shutdown()


def as_hosts(hosts: WorldHost | WorldHosts) -> WorldHosts:
    return hosts if isinstance(hosts, WorldHosts) else WorldHosts([hosts])
