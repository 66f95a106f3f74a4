"""Provenance encoding and the block key layout (identity/provenance.py, identity/keys.py); chains are
the execution identity's (tests/identity/test_execution_identity.py)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import (
    DOMAIN_BLOCK,
    DOMAIN_ROOT,
    KEY_BYTES,
    BlockKey,
    block_key,
    check_key,
    root_from_encoding,
)
from execstate.identity.provenance import DOMAIN_PROVENANCE, Provenance, numerics_id

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE = Provenance(
    model_id="Qwen/Qwen3-30B-A3B",
    weights_version="sha256:0123abcd",
    dtype="bfloat16",
    numerics="eager+torch-cpu",
)
ROOT = ExecutionIdentity(BASE).root

# Golden values: they change only if the encoding or key layout changes (which changes every
# cached key in a deployment). Update them deliberately, never to make a test pass.
GOLDEN_ENCODING = (
    b'{"dtype":"bfloat16","model_id":"Qwen/Qwen3-30B-A3B","numerics":"eager+torch-cpu","v":2,'
    b'"weights_version":"sha256:0123abcd"}'
)
GOLDEN_DIGEST = "739e3f7d0d8f998ce18d1907a0da8982cde3696fdf85fdd26d2b433f8e3917c0"
GOLDEN_BLOCK_EXTRA = "449e029a5c25bfbe224aea53b4b978946c38cd32dd3c4354f5311dc148841be1"


def _u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


# -- provenance --------------------------------------------------------------------------------


def test_encoding_is_canonical_json_golden():
    assert BASE.encode() == GOLDEN_ENCODING
    # Equal values give equal bytes regardless of construction order.
    other = Provenance(numerics="eager+torch-cpu", dtype="bfloat16", weights_version="sha256:0123abcd",
                       model_id="Qwen/Qwen3-30B-A3B")  # fmt: skip
    assert other.encode() == GOLDEN_ENCODING


def test_encoding_non_ascii_is_utf8():
    p = BASE.replace(model_id="modèle")
    assert '"model_id":"modèle"'.encode() in p.encode()


def test_digest_golden_and_domain_tagged():
    assert BASE.digest() == GOLDEN_DIGEST
    payload = BASE.encode()
    manual = hashlib.sha256(
        _u64(len(DOMAIN_PROVENANCE)) + DOMAIN_PROVENANCE + _u64(len(payload)) + payload
    ).hexdigest()
    assert BASE.digest() == manual
    assert BASE.digest() != hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize(
    ("field", "value", "exc"),
    [
        ("numerics", "fast", ValueError),
        ("numerics", "eager", ValueError),  # the kernel family (hence the device) is never implied
        ("numerics", "Eager+torch-cpu", ValueError),
        ("numerics", "eager+", ValueError),
        ("numerics", "fast+cpu-avx2-v1", ValueError),
        ("numerics", "eager+CPU", ValueError),
        ("model_id", "", ValueError),
        ("model_id", "m" * 513, ValueError),
        ("weights_version", "", ValueError),
        ("dtype", None, TypeError),
        ("weights_version", 3, TypeError),
    ],
)
def test_provenance_validation(field, value, exc):
    with pytest.raises(exc, match=field):
        BASE.replace(**{field: value})


def test_provenance_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.numerics = "compiled+torch-cpu"  # type: ignore[misc]
    assert BASE.replace() == BASE
    assert {BASE, BASE.replace()} == {BASE}
    changed = BASE.replace(numerics="compiled+torch-cpu")
    assert changed.numerics == "compiled+torch-cpu" and BASE.numerics == "eager+torch-cpu"


def test_numerics_id_names_mode_and_family():
    assert numerics_id("eager", "torch-cuda-sm90") == "eager+torch-cuda-sm90"
    with pytest.raises(ValueError, match="numerics"):
        numerics_id("eager", "")


# -- block_key ------------------------------------------------------------------------------------


def test_root_layout():
    enc = b'{"any":"encoding"}'
    manual = hashlib.sha256(_u64(len(DOMAIN_ROOT)) + DOMAIN_ROOT + _u64(len(enc)) + enc).digest()
    assert root_from_encoding(enc) == manual and len(manual) == KEY_BYTES


def test_block_key_layout_matches_documented_bytes():
    parent = ROOT
    toks = [1, 2**40, 0, 7]
    tok_bytes = b"".join(t.to_bytes(8, "little", signed=True) for t in toks)
    head = _u64(len(DOMAIN_BLOCK)) + DOMAIN_BLOCK + parent + _u64(4) + tok_bytes
    assert block_key(parent, toks) == hashlib.sha256(head + b"\x00").digest()
    assert block_key(parent, toks, b"img") == hashlib.sha256(head + b"\x01" + _u64(3) + b"img").digest()
    assert block_key(parent, toks, b"img").hex() == GOLDEN_BLOCK_EXTRA


def test_extra_absent_empty_and_values_all_differ():
    parent = ROOT
    keys = [block_key(parent, [5, 6], e) for e in (None, b"", b"\x00", b"a", b"b")]
    assert len(set(keys)) == 5


def test_block_key_depends_on_parent_order_and_length():
    r = ROOT
    other_parent = BlockKey(bytes(32))
    assert block_key(r, [1, 2, 3]) != block_key(other_parent, [1, 2, 3])
    assert block_key(r, [1, 2, 3]) != block_key(r, [3, 2, 1])
    assert block_key(r, [1, 2, 3]) != block_key(r, [1, 2, 3, 0])
    # Token boundaries are fixed-width: 256 = 0x0100 must not collide with [0, 1]-style splits.
    assert block_key(r, [256]) != block_key(r, [0, 1])


def test_block_key_numpy_inputs_equal_list_input():
    r = ROOT
    want = block_key(r, [3, 70000, 151643])
    for dtype in (np.int32, np.int64, np.uint32, np.uint64):
        assert block_key(r, np.array([3, 70000, 151643], dtype=dtype)) == want
    assert block_key(r, np.array([3, 70000, 151643], dtype=">i8")) == want  # big-endian input
    assert block_key(r, (3, 70000, 151643)) == want
    assert block_key(r, [np.int64(3), 70000, 151643]) == want
    assert block_key(r, np.arange(10)[::3]) == block_key(r, [0, 3, 6, 9])  # non-contiguous view


@pytest.mark.parametrize(
    ("parent", "tokens", "extra", "exc"),
    [
        (bytes(31), [1], None, ValueError),
        ("00" * 32, [1], None, TypeError),
        (bytes(32), [], None, ValueError),
        (bytes(32), [1.0], None, TypeError),
        (bytes(32), ["1"], None, TypeError),
        (bytes(32), [2**63], None, OverflowError),
        (bytes(32), np.array([2**63], dtype=np.uint64), None, OverflowError),
        (bytes(32), np.array([1.0]), None, TypeError),
        (bytes(32), np.zeros((2, 2), dtype=np.int64), None, ValueError),
        (bytes(32), [1], "img", TypeError),
    ],
)
def test_block_key_rejects_bad_input(parent, tokens, extra, exc):
    with pytest.raises(exc):
        block_key(parent, tokens, extra)


def test_check_key():
    check_key(bytes(32))
    with pytest.raises(ValueError):
        check_key(bytes(33))
    with pytest.raises(TypeError):
        check_key(bytearray(32))
