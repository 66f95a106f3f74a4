"""Handoff trust (pure Python): P signs, D accepts only signed or allow-listed handoffs."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execstate.identity.secret_ring import SecretRing
from execstate.transfer.handoff import (
    DOMAIN,
    Handoff,
    HandoffError,
    HandoffTrust,
    check_allow_list,
    wants_remote_prefill,
)

RAW = b"handoff-unit-test-secret-0123456789"
SECRET = SecretRing(RAW)
NOW = 1_700_000_000.0
H = Handoff("prefill-0", "tcp://10.0.0.1:5600", "prefill-0/abc", 3, 4, 16, int(NOW) + 60)


def trust(secret=SECRET, allowed=None, block_size=16) -> HandoffTrust:
    return HandoffTrust(secret, allowed or {}, block_size, clock=lambda: NOW)


def test_signed_handoff_accepted_and_round_trips():
    params = H.to_params(SECRET)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert trust().accept(json.loads(json.dumps(params))) == H  # through JSON, as over HTTP


def test_golden_signature():
    """The canonical encoding is a wire format: an independent HMAC over the documented bytes."""
    body = (b'{"block_size":16,"epoch":3,"expires_at":1700000060,"num_blocks":4,'
            b'"remote_addr":"tcp://10.0.0.1:5600","remote_engine_id":"prefill-0","transfer_id":"prefill-0/abc"}')
    assert H.canonical() == DOMAIN + body
    assert H.sign(SECRET) == hmac.new(RAW, b"execstate/v1/handoff\x00" + body, hashlib.sha256).hexdigest()


TAMPER = {
    "remote_engine_id": "prefill-1",
    "remote_addr": "tcp://6.6.6.6:5600",
    "transfer_id": "prefill-0/other",
    "epoch": 4,
    "num_blocks": 5,
    "expires_at": int(NOW) + 3600,
}


@pytest.mark.parametrize("field", sorted(TAMPER))
def test_every_signed_field_is_covered(field):
    params = dict(H.to_params(SECRET), **{field: TAMPER[field]})
    with pytest.raises(HandoffError, match="signature does not match"):
        trust().accept(params)


@given(st.sampled_from(sorted(TAMPER)), st.one_of(st.text(max_size=40), st.integers(0, 2**62)))
def test_any_change_of_a_signed_field_is_refused(field, value):
    params = H.to_params(SECRET)
    if params[field] == value:
        return
    with pytest.raises(HandoffError):
        trust().accept(dict(params, **{field: value}))


def test_wrong_secret_missing_signature_expired_unknown_engine():
    with pytest.raises(HandoffError, match="signature does not match"):
        trust().accept(H.to_params(SecretRing(b"another-secret-of-sufficient-len")))
    with pytest.raises(HandoffError, match="not signed and that engine is not in allowed_prefill_engines"):
        trust().accept(H.to_params(None))
    with pytest.raises(HandoffError, match="expired"):
        HandoffTrust(SECRET, {}, 16, clock=lambda: NOW + 61).accept(H.to_params(SECRET))
    with pytest.raises(HandoffError, match="no handoff secret"):
        trust(secret=None, allowed={"prefill-0": "tcp://10.0.0.1:5600"}).accept(H.to_params(SECRET))
    with pytest.raises(HandoffError, match="block_size 16 is not this instance's 8"):
        trust(block_size=8).accept(H.to_params(SECRET))


def test_allow_listed_engine_dials_its_listed_address():
    t = trust(secret=None, allowed={"prefill-0": "tcp://10.9.9.9:7000"})
    params = dict(H.to_params(None), remote_addr="tcp://6.6.6.6:1")  # a client's invention
    assert t.accept(params).remote_addr == "tcp://10.9.9.9:7000"
    with pytest.raises(HandoffError, match="'prefill-1'"):
        t.accept(dict(params, remote_engine_id="prefill-1"))
    # a present but wrong signature is refused even for a listed engine
    with pytest.raises(HandoffError, match="signature does not match"):
        trust(allowed={"prefill-0": "tcp://10.9.9.9:7000"}).accept(dict(params, signature="00" * 32))


@pytest.mark.parametrize(
    ("field", "value"),
    [("epoch", True), ("epoch", -1), ("epoch", "3"), ("num_blocks", 0), ("remote_addr", "http://x:1"),
     ("remote_addr", "tcp://x"), ("transfer_id", ""), ("transfer_id", "x" * 257), ("expires_at", 1.5)],
)
def test_malformed_fields_name_the_field(field, value):
    params = dict(H.to_params(SECRET), **{field: value})
    with pytest.raises(HandoffError, match=field):
        trust().accept(params)
    with pytest.raises(HandoffError):
        trust().accept(["not", "a", "dict"])  # type: ignore[arg-type]


def test_secret_resolution(monkeypatch):
    monkeypatch.delenv("EXECSTATE_KV_SECRET", raising=False)
    assert SecretRing.resolve() is None
    monkeypatch.setenv("EXECSTATE_KV_SECRET", "from-the-environment-123")
    assert SecretRing.resolve().current == b"from-the-environment-123"
    assert SecretRing.resolve("explicit-secret-0123456").current == b"explicit-secret-0123456"
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SecretRing.resolve("short")


def test_allow_list_validation_and_wants_remote_prefill():
    assert check_allow_list(None) == {}
    assert check_allow_list({"p": "tcp://[::1]:5600"}) == {"p": "tcp://[::1]:5600"}
    with pytest.raises(ValueError, match="'p'"):
        check_allow_list({"p": "10.0.0.1:5600"})
    assert wants_remote_prefill({"do_remote_prefill": True})
    assert not wants_remote_prefill({"do_remote_decode": True}) and not wants_remote_prefill(None)
