"""The offload unit's record and blob (state/tiers/unit.py): exact round trips, signatures, and
every malformed blob refused with ``UnitFormatError`` (never another exception)."""

from __future__ import annotations

import contextlib
import hashlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.identity.keys import block_key
from execstate.identity.secret_ring import SecretRing
from execstate.state.tiers.unit import (
    FORMAT_VERSION,
    MAGIC,
    UnitFormatError,
    UnitLayout,
    UnitRecord,
    blob_nbytes,
    pack_unit,
    sign,
    tag_valid,
    unpack_unit,
)

LAYOUT = UnitLayout(num_layers=2, block_size=4, num_kv_heads=1, head_dim=2, dtype="float32",
                    route_layers=2, route_top_k=2)


def unit(seed: int = 0) -> tuple[UnitRecord, bytes, bytes]:
    root = hashlib.sha256(b"root").digest()
    tokens = [seed + 3, 7, 11, 13]
    kv = bytes((seed + i) % 251 for i in range(LAYOUT.kv_nbytes))
    routes = bytes((seed + 2 * i) % 7 for i in range(LAYOUT.routes_nbytes))
    rec = UnitRecord(FORMAT_VERSION, block_key(root, tokens), root, root, tokens, LAYOUT,
                     hashlib.sha256(kv).digest(), hashlib.sha256(routes).digest())
    return rec, routes, kv


def test_layout_sizes():
    assert LAYOUT.kv_nbytes == 2 * 2 * 4 * 1 * 2 * 4 == 128
    assert LAYOUT.routes_nbytes == 4 * 2 * 2 * 2 == 32
    assert UnitLayout(1, 16, 4, 64, "bfloat16").routes_nbytes == 0


def test_round_trip_is_exact():
    rec, routes, kv = unit(5)
    parts = pack_unit(rec, routes, kv)
    blob = b"".join(parts)
    assert blob_nbytes(parts) == len(blob)
    assert blob.startswith(MAGIC)
    got, got_routes, got_kv = unpack_unit(blob)
    assert got == rec
    assert bytes(got_routes) == routes and bytes(got_kv) == kv


def test_dense_unit_has_no_route_section():
    rec, _, kv = unit()
    dense = msgspec.structs.replace(rec, layout=UnitLayout(2, 4, 1, 2, "float32"), routes_checksum=None)
    got, routes, got_kv = unpack_unit(b"".join(pack_unit(dense, None, kv)))
    assert routes is None and bytes(got_kv) == kv and got.routes_checksum is None


@pytest.mark.parametrize("cut", [1, 10, 40, 60])
def test_truncated_blob_is_refused(cut):
    rec, routes, kv = unit()
    blob = b"".join(pack_unit(rec, routes, kv))
    with pytest.raises(UnitFormatError, match="truncated|magic"):
        unpack_unit(blob[: len(blob) - cut] if cut < len(blob) else blob[:cut])


def test_extra_bytes_and_bad_magic_are_refused():
    rec, routes, kv = unit()
    blob = b"".join(pack_unit(rec, routes, kv))
    with pytest.raises(UnitFormatError, match="truncated"):
        unpack_unit(blob + b"\0")
    with pytest.raises(UnitFormatError, match="magic"):
        unpack_unit(b"X" + blob[1:])


def test_signature_binds_every_field():
    ring = SecretRing(b"0123456789abcdef0123")
    rec, _, _ = unit()
    signed = sign(rec, ring)
    assert signed.tag is not None and len(signed.tag) == 64  # hex HMAC-SHA256
    assert tag_valid(signed, ring)
    assert not tag_valid(signed, SecretRing(b"another-secret-0123456"))
    assert not tag_valid(rec, ring)  # an unsigned unit never verifies
    for field, value in [("token_ids", [1, 2, 3, 4]), ("kv_checksum", b"\1" * 32), ("routes_checksum", b"\2" * 32),
                         ("parent", b"\3" * 32), ("weights_version", "w2"), ("tenant", "bravo")]:
        assert not tag_valid(msgspec.structs.replace(signed, **{field: value}), ring), field


def test_a_per_process_key_signs_for_its_process_only_and_rotation_keeps_units():
    rec, _, _ = unit()
    mine, other = SecretRing.ephemeral(), SecretRing.ephemeral()
    assert not mine.shared and tag_valid(sign(rec, mine), mine) and not tag_valid(sign(rec, mine), other)
    old, new = b"the-old-secret-0123456789", b"the-new-secret-0123456789"
    signed_old = sign(rec, SecretRing(old))
    assert tag_valid(signed_old, SecretRing(new, (old,)))  # a rotation is not a cache flush
    assert not tag_valid(signed_old, SecretRing(new))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_decoder(data):
    with contextlib.suppress(UnitFormatError):
        unpack_unit(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_one_flipped_header_byte_is_refused_or_decoded_whole(pos, value):
    rec, routes, kv = unit()
    blob = bytearray(b"".join(pack_unit(rec, routes, kv)))
    head = len(blob) - len(routes) - len(kv)
    pos %= head
    blob[pos] = value
    try:
        got, r, k = unpack_unit(bytes(blob))
    except UnitFormatError:
        return
    assert len(k) == got.layout.kv_nbytes and (r is None or len(r) == got.layout.routes_nbytes)
