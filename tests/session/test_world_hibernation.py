"""World-session hibernation (session/world/hibernation.py): a session hibernated (its K/V blocks
back in the pool) and woken produces the frames and K/V of a session that never slept, bit for bit,
from the DRAM and the disk tier; its checkpoints survive the sleep; another tenant can neither wake
nor see it; a unit that is missing, truncated, of another tenant, stale, of another model version
or signed by another secret is refused before use and the session ends, holding nothing."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from world_helpers import run, start_frames, table_kv, tiny_world_model

from execstate.identity.secret_ring import SecretRing
from execstate.identity.tenant import TenantId
from execstate.session.runtime.access import WORLD, Access, Owner
from execstate.session.runtime.events import SessionEventError
from execstate.session.world.hibernation import WorldHibernated, hibernate
from execstate.session.world.hibernation_wire import decode_hibernation, digest, encode_hibernation
from execstate.session.world.offline import World
from execstate.state.tiers.disk_store import DiskStore
from execstate.state.tiers.memory_store import MemoryStore

BEFORE = [[("key", {"key": "left", "down": True})], [("prompt", {"text": "snow"})], []]
PENDING = ("action", {"key": "right"})
AFTER = [[("key", {"key": "left", "down": False})], [("key", {"key": "up", "down": True})], [],
         [("action", {"keys": ["down", "up"]})]]
A = Access(Owner(TenantId("alice"), WORLD))
B = Access(Owner(TenantId("bob"), WORLD))


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


def _tier(kind: str, tmp_path):
    return MemoryStore(8 << 20) if kind == "dram" else DiskStore(tmp_path / "world-hib", 8 << 20)


def _record(world: World, sid: str, access: Access = A) -> WorldHibernated:
    rt = world.sessions.manager.get(sid, access, wake=False)
    assert rt.status.value == "hibernated"
    return rt.hibernation


def _code(fn) -> str:
    with pytest.raises(SessionEventError) as e:
        fn()
    return e.value.code


@pytest.mark.parametrize("tier", ["dram", "disk"])
def test_woken_session_equals_one_that_never_slept(model, tier, tmp_path) -> None:
    w, ref = World(model=model, hibernate_to=_tier(tier, tmp_path)), World(model=model)
    s = w.open_session(prompt="a meadow maze", seed=4, start_frames=start_frames(), session_id="walker")
    t = ref.open_session(prompt="a meadow maze", seed=4, start_frames=start_frames(), session_id="walker")
    got, want = run(s, BEFORE), run(t, BEFORE)
    for x in (s, t):
        x.submit_event(x.next_event_id(), *PENDING)  # pending across the sleep
    key = s.state_key()
    info = s.hibernate()
    assert info.status == "hibernated" and info.blocks_in_use == 0 and info.num_pending_events == 1
    assert w.sessions.store.pool.num_used == 0  # memory released: no K/V block held
    assert w.sessions.hibernation_store.stats.snapshot().units == 1
    assert s.hibernate().status == "hibernated"  # idempotent
    r = s.step()  # wakes transparently
    assert r.keys == ("right", "right") and s.state_key() != key and s.status == "open"
    assert w.sessions.hibernation_store.stats.snapshot().units == 0  # the unit left the tier at wake
    got += [r.frames_sha256, *run(s, AFTER[:2])]
    want += run(t, [[], *AFTER[:2]])
    s.hibernate()
    s.submit_event(s.next_event_id(), "action", {"key": "down"})  # an event wakes it too
    assert s.status == "open"
    got += run(s, AFTER[2:])
    t.submit_event(t.next_event_id(), "action", {"key": "down"})
    want += run(t, AFTER[2:])
    assert got == want and table_kv(w, s) == table_kv(ref, t) and s.info().held_key == t.info().held_key == "up"
    for x in (w, ref):
        x.sessions.check_integrity()
        x.close()
        assert x.sessions.store.pool.num_used == 0


def test_hibernate_after_checkpoint_then_rollback(model, tmp_path) -> None:
    w, ref = World(model=model, hibernate_to=_tier("disk", tmp_path)), World(model=model)
    s, t = (x.open_session(seed=2, start_frames=start_frames(), session_id="cp") for x in (w, ref))
    run(s, BEFORE[:2]), run(t, BEFORE[:2])
    cp_s, cp_t = s.checkpoint(), t.checkpoint()
    s.hibernate()
    assert w.sessions.store.pool.num_used == 0  # the checkpoint's and origin's chunks too
    assert s.wake().status == "open" and s.info().num_checkpoints == 1
    assert run(s, AFTER[:2]) == run(t, AFTER[:2])
    s.hibernate()
    s.rollback(cp_s), t.rollback(cp_t)  # wakes, then rolls back to the checkpoint taken before the first sleep
    assert run(s, AFTER[1:]) == run(t, AFTER[1:]) and table_kv(w, s) == table_kv(ref, t)
    s.hibernate()
    s.reset(), t.reset()  # the origin (the start frames) survived two sleeps
    assert run(s, BEFORE) == run(t, BEFORE)
    w.sessions.check_integrity()
    w.close(), ref.close()
    assert w.sessions.store.pool.num_used == 0


def test_another_tenant_can_neither_wake_nor_see_it(model) -> None:
    w = World(model=model)
    rt = w.sessions.open("mine", seed=1, start_frames=start_frames(), access=A)
    hibernate(w.sessions, rt.session_id, A)
    for fn in (lambda: w.sessions.info("mine", B), lambda: w.sessions.step("mine", None, B),
               lambda: w.sessions.submit_event("mine", 1, "action", {"key": "up"}, B),
               lambda: hibernate(w.sessions, "mine", B)):
        assert _code(fn) == "not_found"
    assert [i.session_id for i in w.sessions.list(B)] == []
    assert w.sessions.info("mine", A).status == "hibernated"  # info does not wake it
    assert w.sessions.step("mine", None, A).step_index == 1
    w.close()


def _forge(w: World, sid: str, data: bytes) -> None:
    """The tier now answers ``data`` for the session's unit, and the record expects it (only the
    contents' checks can tell)."""
    rec = _record(w, sid)
    rec.store.discard(rec.key)
    assert rec.store.put(rec.key, [data])
    rec.digest = digest(data)


def _resign(w: World, sid: str, change) -> bytes:
    rec = _record(w, sid)
    h = decode_hibernation(bytes(rec.store.get(rec.key)), w.sessions.hibernation_secret)
    return encode_hibernation(change(h), w.sessions.hibernation_secret)


def _other_tenant(w: World, sid: str) -> bytes:
    rt = w.sessions.open(sid, seed=4, start_frames=start_frames(), access=B)  # same id, another tenant
    w.sessions.step(sid, "up", B)
    rec = hibernate(w.sessions, rt.session_id, B)
    return bytes(rec.store.get(rec.key))


def _stale(h):
    return msgspec.structs.replace(h, offer=msgspec.structs.replace(h.offer, step_index=h.offer.step_index - 1))


def _other_model(h):
    return msgspec.structs.replace(h, offer=msgspec.structs.replace(h.offer, provenance_digest="0" * 64))


INJECT = {
    "missing": (lambda w, sid: _record(w, sid).store.discard(_record(w, sid).key), "lost"),
    "truncated": (lambda w, sid: _truncate(w, sid), "checksum_mismatch"),
    "truncated_consistent": (lambda w, sid: _forge(w, sid, bytes(_read(w, sid))[:-100]), "invalid"),
    "other_tenant": (lambda w, sid: _forge(w, sid, _other_tenant(w, sid)), "desync"),
    "stale_step": (lambda w, sid: _forge(w, sid, _resign(w, sid, _stale)), "desync"),
    "other_model": (lambda w, sid: _forge(w, sid, _resign(w, sid, _other_model)), "incompatible"),
    "other_secret": (lambda w, sid: _forge(w, sid, encode_hibernation(
        decode_hibernation(_read(w, sid), w.sessions.hibernation_secret), SecretRing(b"x" * 32))), "unauthorized"),
}


def _read(w: World, sid: str) -> bytes:
    rec = _record(w, sid)
    return bytes(rec.store.get(rec.key))


def _truncate(w: World, sid: str) -> None:
    rec = _record(w, sid)
    data = _read(w, sid)
    rec.store.discard(rec.key)
    rec.store.put(rec.key, [data[: len(data) // 2]])


@pytest.mark.parametrize("kind", sorted(INJECT))
def test_bad_unit_is_refused_before_use(model, kind, tmp_path) -> None:
    w = World(model=model, hibernate_to=_tier("disk", tmp_path))
    w.sessions.open("victim", seed=4, start_frames=start_frames(), access=A)
    w.sessions.step("victim", "left", A)
    w.sessions.checkpoint("victim", A)
    hibernate(w.sessions, "victim", A)
    inject, code = INJECT[kind]
    inject(w, "victim")
    with pytest.raises(SessionEventError) as e:
        w.sessions.step("victim", None, A)
    assert e.value.code == code and "could not wake" in e.value.message, e.value
    info = w.sessions.info("victim", A)
    assert info.status == "evicted" and "could not wake" in info.error  # ended: never served wrong frames
    assert _code(lambda: w.sessions.step("victim", None, A)) == "evicted"
    w.sessions.close("victim", A)
    w.sessions.close_all()
    w.sessions.check_integrity()
    assert w.sessions.store.pool.num_used == 0


def test_full_tier_keeps_the_session_awake(model) -> None:
    w = World(model=model, hibernate_to=MemoryStore(1000))
    s = w.open_session(seed=1, start_frames=start_frames())
    assert _code(s.hibernate) == "unavailable"
    assert s.status == "open" and s.step().step_index == 1
    w.close()


@pytest.mark.parametrize("tier", ["dram", "disk"])
def test_hibernate_and_wake_time(model, tier, tmp_path) -> None:
    """Not a bound: prints the times (docs/offload.md quotes them) and checks they are finite."""
    w = World(model=model, hibernate_to=_tier(tier, tmp_path))
    s = w.open_session(seed=1, start_frames=start_frames())
    run(s, BEFORE)
    hib, wake = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        s.hibernate()
        t1 = time.perf_counter()
        s.wake()
        hib.append(t1 - t0), wake.append(time.perf_counter() - t1)
    print(f"{tier}: hibernate {min(hib) * 1e3:.2f} ms, wake {min(wake) * 1e3:.2f} ms (best of 5)")
    assert 0 < min(hib) < 10 and 0 < min(wake) < 10
    w.close()


def test_world_hibernation_desync_kinds_are_detected(model, tmp_path) -> None:
    from support.world_hibernation_desync import WorldHibernationDesyncTarget

    from execstate_bench.desync import detection_table, run_trials

    targets = [WorldHibernationDesyncTarget(model), WorldHibernationDesyncTarget(model, _tier("disk", tmp_path))]
    try:
        results = run_trials(targets)
    finally:
        for t in targets:
            t.close()
    rows = {r.kind: r for r in detection_table(results)}
    assert set(rows) == {"truncated", "other_tenant", "stale_step"}
    for r in rows.values():
        assert (r.injected, r.detected, r.error, r.wrong) == (2, 2, 2, 0), (r, results)
    codes = {(r.kind, r.detail.split(":")[0]) for r in results}
    assert codes == {("truncated", "checksum_mismatch"), ("other_tenant", "desync"), ("stale_step", "desync")}
    for t in targets:
        assert t.world.sessions.store.pool.num_used == 0


def test_async_world_hibernates_and_wakes_on_the_next_call(model) -> None:
    from execstate.session.world.async_world import AsyncWorld

    w, ref = World(model=model), World(model=model)
    t = ref.open_session(seed=3, start_frames=start_frames())

    async def main() -> list[str]:
        aw = AsyncWorld(w).scoped(A)
        info = await aw.open(seed=3, start_frames=start_frames())
        sid = info.session_id
        out = [(await aw.step(sid, "left")).frames_sha256]
        assert (await aw.hibernate(sid)).status == "hibernated" and w.sessions.store.pool.num_used == 0
        assert (await aw.wake(sid)).status == "open"
        await aw.hibernate(sid)
        out.append((await aw.step(sid, "up")).frames_sha256)  # a step wakes it
        await aw.shutdown()
        return out

    assert asyncio.run(main()) == [t.step("left").frames_sha256, t.step("up").frames_sha256]
    ref.close()
