"""Pairing a prefill replica with a decode replica of one weights version (docs/fleet.md, "PD as two
deployments").

A PD request runs in two stages, each routed by the fleet's router among the replicas of one
deployment: its prefill on a prefill replica, then its decode on a decode replica, which reads the
prompt's KV from that prefill replica (NIXL, signed handoff). Both stages must run the same weights
version: KV computed by one version is never decoded by another. The pairing rule:

1. **Prefill**: the request may go to a prefill replica of a version some decode replica runs
   (:meth:`VersionDirectory.pair_versions`, from the versions the ingress last saw); among those
   the router picks by execution-compatible prefix and load. No version known on one side: no
   constraint (the replicas decide, step 3). Known on both sides but no version in common (a
   rolling update between its prefill and decode halves): no pair now (:class:`NoPair`); the
   ingress waits, forgets the versions it knew (:meth:`VersionDirectory.forget_versions`) and
   tries again, unconstrained: the replicas' answers and refusals teach the versions anew.
2. **Decode**: bound to the version the prefill replica answered with (:func:`decode_route`); the
   router ranks the decode replicas of that version by their own cached prefix (blocks loaded by
   earlier requests are cached there: a replica holding the prefix needs less transfer) and load.
3. A replica asked for a version it does not run refuses before its engine sees the request (the
   replica's check under its version gate, the guarantee: routing stats can be half a second old);
   the ingress records the version it named, excludes it, and tries another.

Pure Python (no Ray): the ingress (``fleet/ray_app/pd_ingress.py``) owns one directory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from execstate.fleet.router.policy import RouteRequest

PREFILL, DECODE = "prefill", "decode"
ROLES = (PREFILL, DECODE)


class NoPair(Exception):  # noqa: N818 - a state, not a failure of the code
    """No weights version is run by both a prefill and a decode replica (outside the excluded)."""

    def __init__(self, prefill: set[str], decode: set[str]) -> None:
        super().__init__(f"no prefill and decode replicas on one weights version (prefill: {sorted(prefill)}, "
                         f"decode: {sorted(decode)})")
        self.prefill, self.decode = prefill, decode


class VersionDirectory:
    """Replica id -> (role, weights version), as last seen (registration, answers, refusals,
    weight updates). A replica's version changes only through a weight update, which the replica
    serialises with its requests; the directory can lag, never lead: step 3 of the module's rule."""

    def __init__(self) -> None:
        self._replicas: dict[str, tuple[str, str | None]] = {}

    def record(self, replica_id: str, role: str, version: str | None) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        old = self._replicas.get(replica_id)
        if version is None and old is not None:
            version = old[1]
        self._replicas[replica_id] = (role, version)

    def forget(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    def forget_versions(self) -> None:
        """Every version unknown again (roles kept): the next pair is unconstrained and the
        replicas' answers and refusals teach the versions anew (after a :class:`NoPair`)."""
        self._replicas = {rid: (role, None) for rid, (role, _) in self._replicas.items()}

    def role_of(self, replica_id: str) -> str | None:
        entry = self._replicas.get(replica_id)
        return None if entry is None else entry[0]

    def version_of(self, replica_id: str) -> str | None:
        entry = self._replicas.get(replica_id)
        return None if entry is None else entry[1]

    def replicas(self, role: str) -> list[str]:
        return sorted(rid for rid, (r, _) in self._replicas.items() if r == role)

    def versions(self, role: str, exclude: Iterable[str] = ()) -> set[str] | None:
        """Versions of ``role``'s replicas outside ``exclude`` (all of them when every one is
        excluded, as the router does); None when one of them has no known version."""
        ids = self.replicas(role)
        kept = [rid for rid in ids if rid not in set(exclude)] or ids
        found = [self._replicas[rid][1] for rid in kept]
        if any(v is None for v in found):
            return None
        return {v for v in found if v is not None}

    def pair_versions(self, exclude: Iterable[str] = ()) -> tuple[str, ...] | None:
        """The versions a prefill may run (sorted): those of at least one prefill and one decode
        replica. None: unconstrained (a role has no replica, or one of unknown version). Raises
        :class:`NoPair` when both sides are known and share no version."""
        exclude = set(exclude)
        prefill, decode = self.versions(PREFILL, exclude), self.versions(DECODE, exclude)
        if prefill is None or decode is None or not prefill or not decode:
            return None
        both = prefill & decode
        if not both:
            raise NoPair(prefill, decode)
        return tuple(sorted(both))


def prefill_route(route: RouteRequest, directory: VersionDirectory, exclude: Iterable[str] = ()) -> RouteRequest:
    """The prefill stage's route: the request's tokens and salt, the excluded replicas, the versions
    a decode replica runs (rule 1; raises :class:`NoPair`)."""
    exclude = tuple(sorted(set(exclude)))
    return replace(route, session_replica=None, exclude=exclude, weights_versions=directory.pair_versions(exclude))


def decode_route(route: RouteRequest, version: str, exclude: Iterable[str] = ()) -> RouteRequest:
    """The decode stage's route: the same tokens and salt, bound to the prefill's ``version`` (rule 2)."""
    return replace(route, session_replica=None, exclude=tuple(sorted(set(exclude))), weights_versions=(version,))
