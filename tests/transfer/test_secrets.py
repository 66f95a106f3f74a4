from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execstate.identity.secret_ring import SecretRing

OLD, NEW, OTHER = b"o" * 32, b"n" * 32, b"x" * 32
DOMAIN = b"execstate/v1/test\x00"


def test_rotation_accepts_current_and_previous_signs_with_current() -> None:
    old, rotating, done = SecretRing(OLD), SecretRing(NEW, (OLD,)), SecretRing(NEW)
    payload = b"offer bytes"
    assert rotating.sign(DOMAIN, payload) == done.sign(DOMAIN, payload) != old.sign(DOMAIN, payload)
    # during a rotation a server accepts what either generation signed
    assert rotating.verify(DOMAIN, payload, old.sign(DOMAIN, payload))
    assert rotating.verify(DOMAIN, payload, done.sign(DOMAIN, payload))
    # once it is done, the old secret's signatures are refused
    assert not done.verify(DOMAIN, payload, old.sign(DOMAIN, payload))
    assert not rotating.verify(DOMAIN, payload, SecretRing(OTHER).sign(DOMAIN, payload))


def test_domain_separation_and_malformed_signatures() -> None:
    ring = SecretRing(NEW)
    sig = ring.sign(DOMAIN, b"p")
    assert ring.verify(DOMAIN, b"p", sig)
    assert not ring.verify(b"execstate/v1/other\x00", b"p", sig)
    for bad in (None, 3, "", sig[:-1], sig.upper() + "0", b"x" * 64):
        assert not ring.verify(DOMAIN, b"p", bad)


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_any_change_of_payload_breaks_the_signature(a: bytes, b: bytes) -> None:
    ring = SecretRing(NEW, (OLD,))
    assert ring.verify(DOMAIN, a, ring.sign(DOMAIN, a))
    assert ring.verify(DOMAIN, b, ring.sign(DOMAIN, a)) == (a == b)


def test_resolve_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXECSTATE_KV_SECRET", raising=False)
    monkeypatch.delenv("EXECSTATE_KV_SECRET_PREVIOUS", raising=False)
    assert SecretRing.resolve() is None
    monkeypatch.setenv("EXECSTATE_KV_SECRET", "n" * 32)
    monkeypatch.setenv("EXECSTATE_KV_SECRET_PREVIOUS", f"{'o' * 32},{'p' * 20}")
    ring = SecretRing.resolve()
    assert ring is not None and ring.current == NEW and ring.previous == (OLD, b"p" * 20)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SecretRing.resolve("short")
    with pytest.raises(ValueError, match="previous secret"):
        SecretRing(NEW, (b"tiny",))
    assert "n" * 32 not in repr(ring)
