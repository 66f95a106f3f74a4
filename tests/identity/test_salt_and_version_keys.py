"""Golden keys for a tenant salt and a trainer-supplied weights version (DESIGN.md 2).

A request's ``cache_salt`` and an update's ``weights_version`` enter the provenance, hence
the root of every block key. The encodings are written out by hand and the root recomputed
from the documented byte layout (identity/keys.py), so neither can change by accident.
"""

from __future__ import annotations

import hashlib

import pytest

from execstate.identity.keys import DOMAIN_ROOT, chain_keys, root_key
from execstate.identity.provenance import Provenance

BASE = Provenance("Qwen/Qwen3-30B-A3B", "sha256:0123abcd", "bfloat16", "eager", "free")
SALTED_ENCODING = (
    b'{"cache_salt":"tenant-a","dtype":"bfloat16","model_id":"Qwen/Qwen3-30B-A3B","numerics":"eager",'
    b'"route_mode":"free","v":1,"weights_version":"sha256:0123abcd"}'
)
SALTED_ROOT = "7f0c7af331b3d247a74a693e936f98f5a357850bd903be0a6747a7b1f25aa70a"
SALTED_FIRST_BLOCK_16 = "560b9c53aeae211ed3f6473ce0e91e7c373c36cf8462da960ed9a2da950a26de"
USER_VERSION_ENCODING = (
    b'{"cache_salt":null,"dtype":"bfloat16","model_id":"Qwen/Qwen3-30B-A3B","numerics":"eager",'
    b'"route_mode":"free","v":1,"weights_version":"user:step-1"}'
)
USER_VERSION_ROOT = "4ddd8506336b63b35d8f6ef8739ec659d87aec3a7fae6a0d8a27c3f5effc8507"


def _root_by_hand(enc: bytes) -> str:
    h = hashlib.sha256()
    for part in (DOMAIN_ROOT, enc):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


@pytest.mark.parametrize(
    ("prov", "encoding", "root"),
    [
        (BASE.replace(cache_salt="tenant-a"), SALTED_ENCODING, SALTED_ROOT),
        (BASE.replace(weights_version="user:step-1"), USER_VERSION_ENCODING, USER_VERSION_ROOT),
    ],
)
def test_golden_root(prov, encoding, root):
    assert prov.encode() == encoding
    assert _root_by_hand(encoding) == root == root_key(prov).hex()
    assert root_key(prov) != root_key(BASE)


def test_salt_changes_every_block_key():
    toks = list(range(1000, 1040))
    salted = chain_keys(BASE.replace(cache_salt="tenant-a"), toks, 16)
    assert salted[0].hex() == SALTED_FIRST_BLOCK_16
    assert not set(salted) & set(chain_keys(BASE, toks, 16))
    assert not set(salted) & set(chain_keys(BASE.replace(cache_salt="tenant-b"), toks, 16))


def test_a_supplied_version_never_equals_a_digest():
    """Digests are 64 hex digits; a supplied version is bound as "user:<v>" (weight_update.py)."""
    digest_like = "0" * 64
    assert root_key(BASE.replace(weights_version="user:" + digest_like)) != root_key(
        BASE.replace(weights_version=digest_like))


@pytest.mark.parametrize("field", ["cache_salt", "weights_version", "model_id"])
def test_text_that_is_not_utf8_is_refused(field):
    with pytest.raises(ValueError, match=field):
        BASE.replace(**{field: "tenant\ud800"})
