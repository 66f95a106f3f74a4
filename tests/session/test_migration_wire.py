"""The session offer on the wire (no model): typed msgpack, signed; whatever arrives is either a
valid offer or a ``MigrationError`` naming the problem, never another exception; every field the
target checks against its model is refused when wrong."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.events import lm_event_kinds
from execstate.session.lm.migration_state import check_offer, event_queue, route_rows, sampling_params
from execstate.session.lm.migration_wire import (
    FORMAT_VERSION,
    MigrationError,
    SessionOffer,
    SignedOffer,
    WireAck,
    WireEvents,
    WirePending,
    WireSampling,
    decode_offer,
    encode_offer,
)
from execstate.session.runtime.events import EventQueue

SECRET = SecretRing(b"wire-test-secret-0123456789")
VOCAB, MAX_LEN, SHAPE, EXPERTS = 512, 256, (2, 2), 8
RNG_NBYTES = torch.Generator().get_state().numel()


def offer(**over) -> SessionOffer:
    n = 20
    rows = np.tile(np.array([[0, 1], [2, 3]], dtype="<i2"), (n - 1, 1, 1))
    fields = dict(
        format_version=FORMAT_VERSION, session_id="s-1", tenant="team-a", nonce="ab" * 16, target_engine_id="dst",
        source_instance_id="src", provenance_digest="p" * 64,
        cache_salt=None, token_ids=list(range(3, 3 + n)), num_kv_tokens=n - 1, route_rows=rows.tobytes(),
        step_index=2, event_epoch=1, max_event_epoch=3, branch_id="b0",
        seed=7, rng_state=bytes(torch.Generator().manual_seed(7).get_state().numpy()),
        sampling=WireSampling(0.8, 1.0, None, 0.0, 1.0, 0.0, 0.0, {5: 1.5}, 8, 0, None, None, True, None, True),
        priority=1,
        events=WireEvents([WirePending(4, "input", {"token_ids": [9, 10]}),
                           WirePending(5, "composite", {"events": [{"kind": "sampling", "data": {"top_p": 0.5}}]})],
                          5, [WireAck(4, "input", "accepted"), WireAck(5, "composite", "accepted")]),
        handoff=None, commit_by=2e9,
    )
    fields.update(over)
    return SessionOffer(**fields)


def check(o: SessionOffer) -> None:
    check_offer(o, vocab_size=VOCAB, max_model_len=MAX_LEN, route_shape=SHAPE, num_experts=EXPERTS,
                rng_nbytes=RNG_NBYTES)


def test_round_trip_and_the_state_it_rebuilds():
    o = offer()
    got, signed = decode_offer(encode_offer(o, SECRET), SECRET)
    assert got == o and signed
    check(got)
    assert route_rows(got, SHAPE, EXPERTS).shape == (19, 2, 2)
    params = sampling_params(got, VOCAB)
    assert (params.temperature, params.logit_bias, params.seed, params.max_tokens) == (0.8, {5: 1.5}, 7, 8)
    q = event_queue(got, lm_event_kinds(VOCAB, MAX_LEN, None), 8)
    snap = q.snapshot()
    assert [e[0].event_id for e in snap.pending] == [4, 5] and snap.last_id == 5
    assert snap.pending[0][0].data == (9, 10) and snap.pending[1][0].data == {"top_p": 0.5}
    assert q.submit(4, "input", {"token_ids": [1]}).duplicate


def test_signatures():
    data = encode_offer(offer(), SECRET)
    with pytest.raises(MigrationError) as e:
        decode_offer(data, SecretRing(b"another-secret-0123456789"))
    assert e.value.code == "unauthorized"
    with pytest.raises(MigrationError) as e:
        decode_offer(data, None)  # signed, but nothing to check it with
    assert e.value.code == "unauthorized"
    with pytest.raises(MigrationError) as e:  # unsigned: refused whatever it carries
        decode_offer(encode_offer(offer(), None), SECRET)
    assert e.value.code == "unauthorized"
    env = msgspec.msgpack.decode(data, type=SignedOffer)
    forged = msgspec.msgpack.encode(offer(token_ids=list(range(4, 24))))
    with pytest.raises(MigrationError) as e:  # a new payload under the old signature
        decode_offer(msgspec.msgpack.encode(SignedOffer(forged, env.signature)), SECRET)
    assert e.value.code == "unauthorized"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_decode_or_fail_clearly(data):
    try:
        decode_offer(data, SECRET)
    except MigrationError as e:
        assert e.code in ("invalid", "unauthorized")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_any_flipped_byte_is_refused(pos, xor):
    data = bytearray(encode_offer(offer(), SECRET))
    pos %= len(data)
    data[pos] ^= xor or 1
    with pytest.raises(MigrationError) as e:
        decode_offer(bytes(data), SECRET)
    assert e.value.code in ("invalid", "unauthorized")


def test_unknown_fields_and_other_versions():
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(offer()))
    raw["extra"] = 1
    with pytest.raises(MigrationError) as e:
        decode_offer(encode_raw(raw), SECRET)
    assert e.value.code == "invalid"
    with pytest.raises(MigrationError) as e:
        decode_offer(encode_offer(offer(format_version=FORMAT_VERSION + 1), SECRET), SECRET)
    assert e.value.code == "incompatible"
    with pytest.raises(MigrationError) as e:
        decode_offer(encode_offer(offer(tenant="not a tenant"), SECRET), SECRET)
    assert e.value.code == "invalid"


def test_a_rotation_accepts_the_previous_secret():
    old, new = b"the-old-shared-secret-0123", b"the-new-shared-secret-0123"
    data = encode_offer(offer(), SecretRing(old))  # a source not yet given the new secret
    assert decode_offer(data, SecretRing(new, (old,)))[0] == offer()
    with pytest.raises(MigrationError) as e:  # once the rotation is over, the old secret is refused
        decode_offer(data, SecretRing(new))
    assert e.value.code == "unauthorized"


def encode_raw(raw: dict) -> bytes:
    from execstate.session.lm.migration_wire import sign

    payload = msgspec.msgpack.encode(raw)
    return msgspec.msgpack.encode(SignedOffer(payload, sign(SECRET, payload)))


BAD = {
    "token_ids": dict(token_ids=[3] * 19 + [VOCAB]),
    "token_ids ": dict(token_ids=[3] * (MAX_LEN + 1), num_kv_tokens=0, route_rows=b"\0" * (MAX_LEN * 8)),
    "num_kv_tokens": dict(num_kv_tokens=20),
    "event_epoch": dict(event_epoch=4),
    "rng_state": dict(rng_state=b"\0" * 16),
    "route_rows": dict(route_rows=b"\0" * 10),
    "route_rows ": dict(route_rows=np.full((19, 2, 2), EXPERTS, "<i2").tobytes()),
    "route_rows  ": dict(route_rows=np.zeros((19, 2, 2), "<i2").tobytes()),  # an expert twice in a row
    "sampling": dict(sampling=WireSampling(-1.0, 1.0, None, 0.0, 1.0, 0.0, 0.0, None, 8, 0, None, None, True,
                                           None, True)),
    "sampling ": dict(sampling=WireSampling(0.8, 1.0, None, 0.0, 1.0, 0.0, 0.0, {VOCAB: 1.0}, 8, 0, None, None,
                                            True, None, True)),
    "events.pending": dict(events=WireEvents([WirePending(5, "input", {}), WirePending(4, "input", {})], 5, [])),
    "events": dict(events=WireEvents([WirePending(7, "input", {"token_ids": [1]})], 5, [])),
    "commit_by": dict(commit_by=float("nan")),
}


@pytest.mark.parametrize("field", sorted(BAD))
def test_check_offer_refuses_each_bad_field(field):
    with pytest.raises(MigrationError) as e:
        check(offer(**BAD[field]))
    assert e.value.code == "invalid" and f"session offer {field.strip()}" in e.value.message


def test_routes_needed_but_absent_and_bad_pending_events():
    with pytest.raises(MigrationError) as e:
        check(offer(route_rows=None))
    assert e.value.code == "incompatible"
    kinds = lm_event_kinds(VOCAB, MAX_LEN, None)
    bad = offer(events=WireEvents([WirePending(4, "input", {"token_ids": [VOCAB]})], 4, []))
    with pytest.raises(MigrationError) as e:
        event_queue(bad, kinds, 8)
    assert e.value.code == "invalid" and "vocabulary" in e.value.message
    with pytest.raises(MigrationError) as e:
        event_queue(offer(), kinds, 1)  # two pending, the target keeps one per session
    assert e.value.code == "capacity"
    assert isinstance(event_queue(offer(), kinds, 2), EventQueue)
