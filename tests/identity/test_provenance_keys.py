"""Provenance encoding and chained block keys (docs/ARCHITECTURE.md 2)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from execstate.identity.keys import (
    DOMAIN_BLOCK,
    DOMAIN_ROOT,
    KEY_BYTES,
    BlockKey,
    block_key,
    chain_keys,
    check_key,
    root_key,
)
from execstate.identity.provenance import DOMAIN_PROVENANCE, Provenance

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE = Provenance(
    model_id="Qwen/Qwen3-30B-A3B",
    weights_version="sha256:0123abcd",
    dtype="bfloat16",
    numerics="eager",
    route_mode="free",
)
TOKENS = list(range(1000, 1040))  # 40 tokens: 10 full blocks of 4, or 2 of 16 + a tail of 8

# Golden values: they change only if the encoding or key layout changes (which changes every
# cached key in a deployment). Update them deliberately, never to make a test pass.
GOLDEN_ENCODING = (
    b'{"cache_salt":null,"dtype":"bfloat16","model_id":"Qwen/Qwen3-30B-A3B","numerics":"eager",'
    b'"route_mode":"free","v":1,"weights_version":"sha256:0123abcd"}'
)
GOLDEN_DIGEST = "9a684c3a633b2ec21a835f35137d07cc5f0dc482390607e3e1add6d45d1a35b7"
GOLDEN_ROOT = "a069dee6a674581a68887f06f0f4c31044029f0b1dfa8cc3d62b094b69de524e"
GOLDEN_CHAIN_16 = [
    "aabb0fc9dd30e388e903923d8a625b079383c68384d20276849ba3d82cdcb69c",
    "d8c0881c3fccfb4e4d98ec2e8789a08d970dac2f14b41c0016bf594c1c50ca4f",
]
GOLDEN_BLOCK_EXTRA = "111118aca5f67c66660c27980b611463f6f2fd9824696c3d5164c5442d18a588"

# One alternative value per provenance field.
FIELD_CHANGES = {
    "model_id": "Qwen/Qwen3-30B-A3B-Instruct",
    "weights_version": "sha256:0123abce",
    "dtype": "float16",
    "numerics": "compiled",
    "route_mode": "replayed",
    "cache_salt": "tenant-a",
}


def _u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


# -- provenance --------------------------------------------------------------------------------


def test_field_changes_cover_every_field():
    assert set(FIELD_CHANGES) == {f.name for f in dataclasses.fields(Provenance)}


def test_encoding_is_canonical_json_golden():
    assert BASE.encode() == GOLDEN_ENCODING
    # Equal values give equal bytes regardless of construction order.
    other = Provenance(route_mode="free", numerics="eager", dtype="bfloat16", weights_version="sha256:0123abcd",
                       model_id="Qwen/Qwen3-30B-A3B")  # fmt: skip
    assert other.encode() == GOLDEN_ENCODING
    assert BASE.replace(cache_salt="t1").encode().startswith(b'{"cache_salt":"t1",')


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
        ("numerics", "Eager", ValueError),
        ("numerics", "eager+", ValueError),
        ("numerics", "fast+cpu-avx2-v1", ValueError),
        ("numerics", "eager+CPU", ValueError),
        ("route_mode", "replay", ValueError),
        ("model_id", "", ValueError),
        ("weights_version", "", ValueError),
        ("dtype", None, TypeError),
        ("weights_version", 3, TypeError),
        ("cache_salt", "", ValueError),
        ("cache_salt", b"salt", TypeError),
    ],
)
def test_provenance_validation(field, value, exc):
    with pytest.raises(exc, match=field):
        BASE.replace(**{field: value})


def test_provenance_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.numerics = "compiled"  # type: ignore[misc]
    assert BASE.replace() == BASE
    assert {BASE, BASE.replace()} == {BASE}
    changed = BASE.replace(numerics="compiled")
    assert changed.numerics == "compiled" and BASE.numerics == "eager"


# -- every provenance field changes every key ---------------------------------------------------


@pytest.mark.parametrize("field", sorted(FIELD_CHANGES))
def test_each_provenance_field_changes_root_and_every_block_key(field):
    changed = BASE.replace(**{field: FIELD_CHANGES[field]})
    assert changed.encode() != BASE.encode()
    assert changed.digest() != BASE.digest()
    assert root_key(changed) != root_key(BASE)
    base_keys = chain_keys(BASE, TOKENS, 4)
    new_keys = chain_keys(changed, TOKENS, 4)
    assert len(base_keys) == len(new_keys) == 10
    assert not set(base_keys) & set(new_keys)  # no block key survives, at any depth


def test_salt_none_and_salt_present_differ_and_salts_differ():
    keys = {root_key(BASE.replace(cache_salt=s)) for s in (None, "a", "b", "null")}
    assert len(keys) == 4


def test_equal_provenance_equal_keys():
    twin = Provenance(**dataclasses.asdict(BASE))
    assert twin is not BASE
    assert root_key(twin) == root_key(BASE)
    assert chain_keys(twin, TOKENS, 4) == chain_keys(BASE, TOKENS, 4)


# -- block_key ------------------------------------------------------------------------------------


def test_root_key_layout():
    enc = BASE.encode()
    manual = hashlib.sha256(_u64(len(DOMAIN_ROOT)) + DOMAIN_ROOT + _u64(len(enc)) + enc).digest()
    assert root_key(BASE) == manual
    assert len(root_key(BASE)) == KEY_BYTES
    assert root_key(BASE).hex() == GOLDEN_ROOT


def test_block_key_layout_matches_documented_bytes():
    parent = root_key(BASE)
    toks = [1, 2**40, 0, 7]
    tok_bytes = b"".join(t.to_bytes(8, "little", signed=True) for t in toks)
    head = _u64(len(DOMAIN_BLOCK)) + DOMAIN_BLOCK + parent + _u64(4) + tok_bytes
    assert block_key(parent, toks) == hashlib.sha256(head + b"\x00").digest()
    assert block_key(parent, toks, b"img") == hashlib.sha256(head + b"\x01" + _u64(3) + b"img").digest()
    assert block_key(parent, toks, b"img").hex() == GOLDEN_BLOCK_EXTRA


def test_extra_absent_empty_and_values_all_differ():
    parent = root_key(BASE)
    keys = [block_key(parent, [5, 6], e) for e in (None, b"", b"\x00", b"a", b"b")]
    assert len(set(keys)) == 5


def test_block_key_depends_on_parent_order_and_length():
    r = root_key(BASE)
    other_parent = BlockKey(bytes(32))
    assert block_key(r, [1, 2, 3]) != block_key(other_parent, [1, 2, 3])
    assert block_key(r, [1, 2, 3]) != block_key(r, [3, 2, 1])
    assert block_key(r, [1, 2, 3]) != block_key(r, [1, 2, 3, 0])
    # Token boundaries are fixed-width: 256 = 0x0100 must not collide with [0, 1]-style splits.
    assert block_key(r, [256]) != block_key(r, [0, 1])


def test_block_key_numpy_inputs_equal_list_input():
    r = root_key(BASE)
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


# -- chain_keys -------------------------------------------------------------------------------------


def test_chain_keys_equals_manual_chaining():
    keys = chain_keys(BASE, TOKENS, 4)
    parent = root_key(BASE)
    for i, k in enumerate(keys):
        parent = block_key(parent, TOKENS[4 * i : 4 * i + 4])
        assert k == parent
    assert len(set(keys)) == 10


def test_chain_keys_golden():
    assert [k.hex() for k in chain_keys(BASE, TOKENS, 16)] == GOLDEN_CHAIN_16


def test_chain_keys_ignores_tail_and_is_prefix_stable():
    full = chain_keys(BASE, TOKENS, 16)
    assert len(full) == 2  # 40 tokens: 2 full blocks, tail of 8 ignored
    assert chain_keys(BASE, TOKENS[:32], 16) == full
    assert chain_keys(BASE, TOKENS[:33], 16) == full
    assert chain_keys(BASE, TOKENS[:31], 16) == full[:1]
    assert chain_keys(BASE, TOKENS[:15], 16) == []
    assert chain_keys(BASE, [], 16) == []
    # A different tail does not matter; a different token in a full block changes it and all later.
    assert chain_keys(BASE, [*TOKENS[:39], 0], 16) == full
    changed = chain_keys(BASE, [*TOKENS[:20], 0, *TOKENS[21:]], 16)
    assert changed[0] == full[0] and changed[1] != full[1]


def test_chain_keys_block_size_is_part_of_identity():
    by4 = chain_keys(BASE, TOKENS[:8], 4)
    by8 = chain_keys(BASE, TOKENS[:8], 8)
    assert len(by4) == 2 and len(by8) == 1
    assert by8[0] not in by4


def test_chain_keys_extras():
    extras = [None, b"", b"img:1", None, None, None, None, None, None, None]
    keys = chain_keys(BASE, TOKENS, 4, extras)
    parent = root_key(BASE)
    for i, k in enumerate(keys):
        parent = block_key(parent, TOKENS[4 * i : 4 * i + 4], extras[i])
        assert k == parent
    plain = chain_keys(BASE, TOKENS, 4)
    assert keys[0] == plain[0]  # None extra == no extras at all
    assert all(a != b for a, b in zip(keys[1:], plain[1:], strict=True))  # b"" != None, and it chains
    # One entry per block including the partial tail is accepted; the tail"s entry is ignored.
    assert chain_keys(BASE, TOKENS, 16, [b"x", b"y", b"tail"]) == chain_keys(BASE, TOKENS, 16, [b"x", b"y"])


@pytest.mark.parametrize("n_extras", [0, 1, 4])
def test_chain_keys_rejects_wrong_extras_length(n_extras):
    with pytest.raises(ValueError, match="extras"):
        chain_keys(BASE, TOKENS, 16, [None] * n_extras)


@pytest.mark.parametrize("block_size", [0, -4, 2.0, True])
def test_chain_keys_rejects_bad_block_size(block_size):
    with pytest.raises(ValueError, match="block_size"):
        chain_keys(BASE, TOKENS, block_size)


def test_chain_keys_rejects_non_bytes_extra():
    with pytest.raises(TypeError, match=r"extras\[1\]"):
        chain_keys(BASE, TOKENS, 16, [None, "img"])


def test_chain_keys_numpy_equals_list():
    arr = np.array(TOKENS, dtype=np.int32)
    assert chain_keys(BASE, arr, 4) == chain_keys(BASE, TOKENS, 4)


_SUBPROCESS_SRC = """
from execstate.identity.keys import chain_keys, root_key
from execstate.identity.provenance import Provenance
p = Provenance("Qwen/Qwen3-30B-A3B", "sha256:0123abcd", "bfloat16", "eager", "free", cache_salt="t")
print(root_key(p).hex())
print(" ".join(k.hex() for k in chain_keys(p, list(range(1000, 1040)), 4, [b"e"] * 10)))
print(hash("probe"))
"""


def test_keys_equal_across_processes_with_different_hash_seeds():
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        res = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS_SRC], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
        outs.append(res.stdout.splitlines())
    (root_a, chain_a, hash_a), (root_b, chain_b, hash_b) = outs
    assert hash_a != hash_b  # the seeds really differ...
    assert root_a == root_b  # ...and the keys do not care
    assert chain_a == chain_b
    p = BASE.replace(cache_salt="t")
    assert root_a == root_key(p).hex()
    assert chain_a.split() == [k.hex() for k in chain_keys(p, TOKENS, 4, [b"e"] * 10)]


def test_chain_keys_fast_enough():
    toks = list(range(100_000, 104_096))  # 4k tokens, 256 blocks of 16
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        keys = chain_keys(BASE, toks, 16)
        best = min(best, time.perf_counter() - t0)
    assert len(keys) == 256
    # Typically ~0.3 ms in total (~1 us per block); the bound leaves room for slow CI machines.
    assert best < 0.025, f"chain_keys took {best * 1e3:.2f} ms for 256 blocks"
