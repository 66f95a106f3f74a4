"""World-session migration between two Worlds: the session continues at the target exactly as
it would have at the source (frames and K/V bit for bit), with its held key, prompt and pending
events; every refusal leaves the source serving and the target holding nothing."""

from __future__ import annotations

import msgspec
import pytest
from world_helpers import run, start_frames, table_kv, tiny_world_model

from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.migration_wire import MigrationError, WirePending
from execstate.session.world.migration import export_world_session, finish_export, import_world_session
from execstate.session.world.migration_wire import SignedWorldOffer, WorldOffer
from execstate.session.world.offline import World

PLAN = [[("key", {"key": "left", "down": True})], [("prompt", {"text": "snow"})], [], [("action", {"key": "up"})]]
PENDING = ("composite", {"events": [{"kind": "action", "data": {"key": "right"}},
                                   {"kind": "prompt", "data": {"text": "lava"}}]})
AFTER = [[("key", {"key": "left", "down": False})], [("action", {"keys": ["down", "up"]})], []]


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


def _check_empty(*worlds: World) -> None:
    for w in worlds:
        w.sessions.check_integrity()
        w.close()
        w.sessions.check_integrity()
        assert w.sessions.store.pool.num_used == 0


def test_migrated_session_continues_bit_for_bit(model) -> None:
    a, b, ref = World(model=model), World(model=model), World(model=model)
    s = a.open_session(prompt="a meadow maze", seed=4, start_frames=start_frames(), session_id="walker")
    run(s, PLAN)
    s.submit_event(s.next_event_id(), *PENDING)  # pending: travels with the session
    key_before = s.state_key()
    moved = s.migrate(b, secret=SecretRing(b"k" * 32))
    assert s.status == "closed" and moved.session_id == "walker" and moved.step_index == 4
    assert moved.state_key() == key_before and moved.info().held_key == "left" and moved.info().prompt == "snow"
    r = moved.step()
    assert r.keys == ("right", "right") and r.prompt_version == 2
    got = [r.frames_sha256, *run(moved, AFTER)]
    want_s = ref.open_session(prompt="a meadow maze", seed=4, start_frames=start_frames())
    want = run(want_s, [*PLAN, [PENDING], *AFTER])[len(PLAN):]
    assert got == want and table_kv(b, moved) == table_kv(ref, want_s)
    assert moved.submit_event(0, "action", {"key": "up"}).duplicate  # the acknowledgements travelled
    _check_empty(a, b, ref)


def _offer(world: World, sid: str) -> WorldOffer:
    blob = export_world_session(world.sessions, sid)
    finish_export(world.sessions, sid, ok=False)
    return msgspec.msgpack.decode(msgspec.msgpack.decode(blob, type=SignedWorldOffer).payload, type=WorldOffer)


def _blob(o: WorldOffer) -> bytes:
    return msgspec.msgpack.encode(SignedWorldOffer(msgspec.msgpack.encode(o), None))


def test_refusals_leave_both_sides_clean(model) -> None:
    a, b = World(model=model), World(model=model)
    s = a.open_session(seed=1, start_frames=start_frames(), session_id="x")
    run(s, PLAN[:2])
    o = _offer(a, "x")
    chunk = o.chunks[0]
    bad = [
        (msgspec.structs.replace(o, provenance_digest="0" * 64), "incompatible"),
        (msgspec.structs.replace(o, chunks=[msgspec.structs.replace(chunk, k=b"\0" + chunk.k[1:]), *o.chunks[1:]]),
         "checksum_mismatch"),
        (msgspec.structs.replace(o, carry_shape=[1]), "invalid"),
        (msgspec.structs.replace(o, window_chunks=99), "invalid"),
        (msgspec.structs.replace(o, rng_state=b"\0" * 8), "invalid"),
        (msgspec.structs.replace(o, held=msgspec.structs.replace(o.held, key="jump")), "invalid"),
        (msgspec.structs.replace(o, events=msgspec.structs.replace(o.events, pending=[
            WirePending(99, "key", {"key": "fly", "down": True})])),
         "invalid"),
    ]
    for offer, code in bad:
        with pytest.raises(MigrationError) as e:
            import_world_session(b.sessions, _blob(offer))
        assert e.value.code == code, (code, e.value)
        b.sessions.check_integrity()
        assert b.sessions.store.pool.num_used == 0 and b.sessions.manager.num_resident == 0
    with pytest.raises(MigrationError) as e:
        blob = export_world_session(a.sessions, "x", SecretRing(b"s" * 32))
        import_world_session(b.sessions, blob, SecretRing(b"t" * 32))
    assert e.value.code == "unauthorized"
    with pytest.raises(Exception) as e2:
        s.step()  # MIGRATING until the export is finished
    assert getattr(e2.value, "code", None) == "busy"
    finish_export(a.sessions, "x", ok=False)
    other = World(model=tiny_world_model(seed=1))
    with pytest.raises(MigrationError) as e:
        s.migrate(other)
    assert e.value.code == "incompatible" and s.status == "open"
    assert run(s, [[]])  # still serving
    _check_empty(a, b, other)
