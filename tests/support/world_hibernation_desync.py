"""The desync harness's world-hibernation target (``execstate_bench/desync.py``): one hibernated world
session's unit corrupted per trial (``session/world/hibernation.py``).

Each trial opens a session on a ``World`` (its hibernation tier: DRAM by default, or disk) and its
twin on an oracle ``World`` that never hibernates, steps both with a key held, hibernates the
session, injects one desync into what the tier answers, and steps both again:

- ``truncated``: the unit cut short in the tier: its sha256 is not the one recorded at hibernation
  (error ``checksum_mismatch``);
- ``other_tenant``: the tier answers the unit of another tenant's session of the same id, and the
  record expects it (a consistent substitution): the unit names another tenant (``desync``);
- ``stale_step``: a validly signed unit of an older step index (a stale writer holding the secret),
  the record expecting it: its session state key is not the session's (``desync``).

A trial is ``wrong`` when a step served frames other than the twin's.
"""

from __future__ import annotations

import contextlib
import itertools

import msgspec

from execstate.identity.tenant import TenantId
from execstate.model.world.interface import WorldModel
from execstate.session.runtime.access import WORLD, Access, Owner
from execstate.session.runtime.events import SessionEventError
from execstate.session.world.hibernation import hibernate
from execstate.session.world.hibernation_wire import decode_hibernation, digest, encode_hibernation
from execstate.session.world.offline import World
from execstate.state.tiers.store import UnitStore
from execstate_bench.desync import TrialResult

OWNER = Access(Owner(TenantId("desync-a"), WORLD))
OTHER = Access(Owner(TenantId("desync-b"), WORLD))


class WorldHibernationDesyncTarget:
    name = "world-hibernation"

    def __init__(self, model: WorldModel, tier: UnitStore | None = None) -> None:
        self.world = World(model=model, numerics=model.spec.numerics, hibernate_to=tier)
        self.oracle = World(model=model, numerics=model.spec.numerics)
        self._ids = itertools.count(1)

    def kinds(self) -> list[str]:
        return ["truncated", "other_tenant", "stale_step"]

    def close(self) -> None:
        self.world.close()
        self.oracle.close()

    def trial(self, kind: str) -> TrialResult:
        n = next(self._ids)
        sid = f"desync-{n}"
        sessions = self.world.sessions
        sessions.open(sid, seed=n, access=OWNER)
        t = self.oracle.open_session(seed=n, session_id=sid)
        try:
            sessions.submit_event(sid, 1, "key", {"key": "left", "down": True}, OWNER)
            t.submit_event(1, "key", {"key": "left", "down": True})
            sessions.step(sid, None, OWNER), t.step()
            record = hibernate(sessions, sid, OWNER)
            blob = record.store.get(record.key)
            assert blob is not None  # just written
            data = bytes(blob)
            secret = sessions.hibernation_secret
            if kind == "truncated":
                forged, consistent = data[: len(data) // 2], False
            elif kind == "other_tenant":
                forged, consistent = self._other_tenant(sid, n), True
            else:
                h = decode_hibernation(data, secret)
                o = msgspec.structs.replace(h.offer, step_index=h.offer.step_index - 1)
                forged, consistent = encode_hibernation(msgspec.structs.replace(h, offer=o), secret), True
            record.store.discard(record.key)
            record.store.put(record.key, [forged])
            if consistent:
                record.digest = digest(forged)  # only the contents' checks can tell
            try:
                got = sessions.step(sid, "up", OWNER)
            except SessionEventError as e:
                return TrialResult(self.name, kind, True, "error", False, f"{e.code}: {e.message}")
            want = t.step("up")
            return TrialResult(self.name, kind, False, "used", got.frames_sha256 != want.frames_sha256,
                               "nothing noticed")
        finally:
            for access in (OWNER, OTHER):
                with contextlib.suppress(SessionEventError):
                    sessions.close(sid, access)
            t.close()

    def _other_tenant(self, sid: str, n: int) -> bytes:
        sessions = self.world.sessions
        sessions.open(sid, seed=n, access=OTHER)
        sessions.step(sid, "left", OTHER)
        rec = hibernate(sessions, sid, OTHER)
        blob = rec.store.get(rec.key)
        assert blob is not None  # just written
        return bytes(blob)
