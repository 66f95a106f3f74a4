"""The fleet's session settings, the same for every engine replica and the ingress (docs/fleet.md).

- ``hibernate_after_s``: a detached session unused this long hibernates on its replica (its
  manifest then in the shared tier; ``--session-hibernate-after``);
- ``copy_every_s``: how often a replica with a Redis tier copies its live sessions that changed to
  the shared tier (``session/lm/shared_copy.py``; None: never). What a lost replica loses of a
  session is the steps after its last copy (or hibernation);
- ``api_keys_file``: the tenants' API keys (``KEY TENANT`` lines, ``--api-keys-file``), read by
  every replica and by the ingress (which resumes a lost replica's sessions for their tenant, and
  routes a prompt by the keys of its caller's cache scope). None: an open fleet (one tenant,
  ``local``);
- ``shared_prefix_groups``: the operator's shared prefix groups (``--shared-prefix-group``), the
  same on every replica and the ingress;
- ``idle_ttl_s``: a detached session unused this long expires on its replica
  (``--session-idle-ttl``, as on one server; None: never);
- ``quotas``: the per-tenant session quotas every replica applies (``--tenant-max-sessions`` ...,
  as on one server);
- ``operators``: the tenants whose keys may change the fleet (``--fleet-operator``: drain, rolling
  update; ``fleet_ops.py``). On an open fleet every caller is the operator.
"""

from __future__ import annotations

from dataclasses import dataclass

from execstate.identity.scope import PrefixSharing
from execstate.serve.app import DEFAULT_IDLE_TTL_S
from execstate.serve.principals import KeyRing
from execstate.state.quotas import Quotas

DEFAULT_COPY_EVERY_S = 1.0


@dataclass(frozen=True)
class SessionSettings:
    hibernate_after_s: float | None = None
    copy_every_s: float | None = DEFAULT_COPY_EVERY_S
    api_keys_file: str | None = None
    shared_prefix_groups: tuple[str, ...] = ()
    idle_ttl_s: float | None = DEFAULT_IDLE_TTL_S
    quotas: Quotas = Quotas()
    operators: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("hibernate_after_s", "copy_every_s", "idle_ttl_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be > 0 s or None, got {v!r}")

    def keys(self) -> KeyRing:
        return KeyRing.build([], self.api_keys_file)

    def sharing(self) -> PrefixSharing:
        return PrefixSharing.parse(self.shared_prefix_groups)
