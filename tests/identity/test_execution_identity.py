"""The execution identity: one value, golden bytes, every field changes every key.

The chain is pinned twice: by golden hex values, and against a second implementation written here
from the byte layouts documented in identity/keys.py and identity/execution.py (hashlib and json
only, no execstate code), so neither the layout nor the code can drift without a test failing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from execstate.identity.execution import IDENTITY_VERSION, ExecutionIdentity, RouteMode
from execstate.identity.provenance import Provenance
from execstate.identity.scope import CacheScope

REPO_ROOT = Path(__file__).resolve().parents[2]
PROV = Provenance("Qwen/Qwen3-30B-A3B", "sha256:0123abcd", "bfloat16", "eager+torch-cpu")
ALPHA = CacheScope.build("alpha")
BASE = ExecutionIdentity(PROV, ALPHA)
TOKENS = list(range(1000, 1040))  # 40 tokens: 2 full blocks of 16 and a tail of 8

# Golden values: they change only if a layout changes (which changes every key of a deployment).
# Update them deliberately, never to make a test pass.
GOLDEN_ENCODING = (
    b'{"dtype":"bfloat16","model_id":"Qwen/Qwen3-30B-A3B","numerics":"eager+torch-cpu","route_mode":"free",'
    b'"salt":null,"scope":"tenant:alpha","v":2,"weights_version":"sha256:0123abcd"}'
)
GOLDEN_ROOT = "8f2c802bc70d2b32a40cd738856710c1a50006dde52fc5d69b584998c00beef6"
GOLDEN_CHAIN_16 = [
    "61f2b6740222a3ddbb96b6abbbbda2b5f69d117bf8de189f61ddb307dacb521e",
    "0f302dfb71ae5e88714ad7e31289be2495b7f2194cbda298304ef0f9a043a756",
]


# -- the second implementation, from the documented layouts ---------------------------------------

def _u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


def _tagged(domain: bytes) -> hashlib._Hash:
    h = hashlib.sha256()
    h.update(_u64(len(domain)) + domain)
    return h


def oracle_encoding(p: Provenance, partition: str, salt: str | None, route_mode: str) -> bytes:
    doc = {"dtype": p.dtype, "model_id": p.model_id, "numerics": p.numerics, "route_mode": route_mode,
           "salt": salt, "scope": partition, "v": 2, "weights_version": p.weights_version}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def oracle_root(enc: bytes) -> bytes:
    h = _tagged(b"execstate/v2/root")
    h.update(_u64(len(enc)) + enc)
    return h.digest()


def oracle_routes_extra(rows: np.ndarray) -> bytes:
    h = _tagged(b"execstate/v1/forced-routes")
    for d in rows.shape:
        h.update(_u64(d))
    h.update(b"".join(int(v).to_bytes(8, "little", signed=True) for v in rows.reshape(-1)))
    return h.digest()


def oracle_chain(root: bytes, tokens: list[int], bs: int, forced: np.ndarray | None = None) -> list[bytes]:
    keys, parent = [], root
    for i in range(len(tokens) // bs):
        h = _tagged(b"execstate/v1/block")
        block = tokens[i * bs:(i + 1) * bs]
        h.update(parent + _u64(bs) + b"".join(t.to_bytes(8, "little", signed=True) for t in block))
        if forced is not None and i * bs < len(forced):
            extra = oracle_routes_extra(forced[i * bs:(i + 1) * bs])
            h.update(b"\x01" + _u64(len(extra)) + extra)
        else:
            h.update(b"\x00")
        parent = h.digest()
        keys.append(parent)
    return keys


# -- golden bytes -----------------------------------------------------------------------------------

def test_encoding_is_canonical_and_golden():
    assert IDENTITY_VERSION == 2
    assert BASE.encode() == GOLDEN_ENCODING
    assert BASE.encode() == oracle_encoding(PROV, "tenant:alpha", None, "free")


def test_root_and_chain_equal_the_second_implementation():
    root = oracle_root(GOLDEN_ENCODING)
    assert BASE.root == root
    assert BASE.chain(TOKENS, 16) == oracle_chain(root, TOKENS, 16)
    assert BASE.chain(TOKENS, 4) == oracle_chain(root, TOKENS, 4)
    salted = ExecutionIdentity(PROV, ALPHA.with_salt("s1"), RouteMode.REPLAYED)
    enc = oracle_encoding(PROV, "tenant:alpha", "s1", "replayed")
    assert salted.encode() == enc and salted.root == oracle_root(enc)


def test_golden_hex_values():
    assert BASE.root.hex() == GOLDEN_ROOT
    assert [k.hex() for k in BASE.chain(TOKENS, 16)] == GOLDEN_CHAIN_16


def test_forced_route_extras_equal_the_second_implementation():
    rng = np.random.default_rng(0)
    forced = np.stack([rng.permutation(8)[:2] for _ in range(24 * 4)]).reshape(24, 4, 2).astype(np.int64)
    ident = ExecutionIdentity(PROV, ALPHA, RouteMode.REPLAYED)
    got = ident.chain(TOKENS, 16, forced_routes=forced)
    assert got == oracle_chain(ident.root, TOKENS, 16, forced)  # block 1 has 8 forced rows, its extra covers them
    assert got != ident.chain(TOKENS, 16)
    with pytest.raises(ValueError, match="REPLAYED"):
        BASE.chain(TOKENS, 16, forced_routes=forced)


# -- every field changes every key --------------------------------------------------------------

VARIANTS = {
    "model_id": ExecutionIdentity(PROV.replace(model_id="Qwen/Qwen3-30B-A3B-Instruct"), ALPHA),
    "weights_version": ExecutionIdentity(PROV.replace(weights_version="sha256:0123abce"), ALPHA),
    "dtype": ExecutionIdentity(PROV.replace(dtype="float16"), ALPHA),
    "numerics mode": ExecutionIdentity(PROV.replace(numerics="compiled+torch-cpu"), ALPHA),
    "device": ExecutionIdentity(PROV.replace(numerics="eager+torch-cuda-sm90"), ALPHA),
    "kernel family": ExecutionIdentity(PROV.replace(numerics="eager+cpu-avx2-v1"), ALPHA),
    "route_mode": ExecutionIdentity(PROV, ALPHA, RouteMode.REPLAYED),
    "tenant": ExecutionIdentity(PROV, CacheScope.build("bravo")),
    "salt": ExecutionIdentity(PROV, ALPHA.with_salt("alpha-secret")),
    "shared group": ExecutionIdentity(PROV, CacheScope.build("alpha", group="common")),
}


def test_variants_cover_every_field():
    fields = {f.name for f in dataclasses.fields(Provenance)} | {"route_mode", "tenant", "salt", "shared group"}
    named = set(VARIANTS) - {"numerics mode", "device", "kernel family"} | {"numerics"}
    assert named == fields


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_each_field_changes_the_root_and_every_block_key(field):
    other = VARIANTS[field]
    assert other.encode() != BASE.encode() and other.root != BASE.root
    a, b = BASE.chain(TOKENS, 4), other.chain(TOKENS, 4)
    assert len(a) == len(b) == 10 and not set(a) & set(b)  # no key survives, at any depth


def test_a_salt_never_reaches_another_tenant():
    # bravo sending alpha's salt names bravo's partition, salted: neither alpha's salted nor unsalted one
    alpha_salted = ExecutionIdentity(PROV, CacheScope.build("alpha", "alpha-secret"))
    bravo_salted = ExecutionIdentity(PROV, CacheScope.build("bravo", "alpha-secret"))
    roots = {BASE.root, alpha_salted.root, bravo_salted.root, ExecutionIdentity(PROV, CacheScope.build("bravo")).root}
    assert len(roots) == 4


def test_a_group_replaces_the_tenant_in_the_key_and_keeps_it_recorded():
    a = ExecutionIdentity(PROV, CacheScope.build("alpha", group="common"))
    b = ExecutionIdentity(PROV, CacheScope.build("bravo", group="common"))
    assert a.root == b.root and a.scope.tenant == "alpha" and b.scope.tenant == "bravo"


def test_equal_values_equal_keys_and_hashable():
    twin = ExecutionIdentity(Provenance(**dataclasses.asdict(PROV)), CacheScope.build("alpha"))
    assert twin == BASE and hash(twin) == hash(BASE) and twin.root == BASE.root
    assert {twin: 1}[BASE] == 1


# -- chain behaviour ------------------------------------------------------------------------------

def test_extend_continues_a_prefix_and_reads_only_new_blocks():
    keys = BASE.chain(TOKENS[:20], 4)  # 5 blocks
    BASE.extend(keys, TOKENS, 4)
    assert keys == BASE.chain(TOKENS, 4)
    n = len(keys)
    BASE.extend(keys, TOKENS, 4)  # nothing new: unchanged
    assert len(keys) == n
    capped: list = []
    BASE.extend(capped, TOKENS, 4, num_blocks=3)
    assert capped == keys[:3]


def test_tail_has_no_key_and_prefixes_are_prefixes():
    full = BASE.chain(TOKENS, 16)
    assert len(full) == 2
    assert BASE.chain(TOKENS[:33], 16) == full and BASE.chain(TOKENS[:31], 16) == full[:1]
    assert BASE.chain([], 16) == []


def test_numpy_tokens_equal_a_list():
    assert BASE.chain(np.array(TOKENS, dtype=np.int32), 4) == BASE.chain(TOKENS, 4)


@pytest.mark.parametrize("bs", [0, -4, 2.0, True])
def test_bad_block_size_is_refused(bs):
    with pytest.raises(ValueError, match="block_size"):
        BASE.chain(TOKENS, bs)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"provenance": "p"}, "provenance"), ({"scope": "alpha"}, "scope"), ({"route_mode": "free"}, "route_mode"),
])
def test_fields_are_typed(kwargs, match):
    with pytest.raises(TypeError, match=match):
        ExecutionIdentity(**{"provenance": PROV, **kwargs})


_SUBPROCESS = """
from execstate.identity.execution import ExecutionIdentity
from execstate.identity.provenance import Provenance
from execstate.identity.scope import CacheScope
i = ExecutionIdentity(Provenance("Qwen/Qwen3-30B-A3B", "sha256:0123abcd", "bfloat16", "eager+torch-cpu"),
                      CacheScope.build("alpha", "s"))
print(" ".join(k.hex() for k in i.chain(list(range(1000, 1040)), 4)))
print(hash("probe"))
"""


def test_keys_equal_across_processes_with_different_hash_seeds():
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        res = subprocess.run([sys.executable, "-c", _SUBPROCESS], env=env, cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=60, check=True)
        outs.append(res.stdout.splitlines())
    assert outs[0][1] != outs[1][1] and outs[0][0] == outs[1][0]
    assert outs[0][0].split() == [k.hex() for k in ExecutionIdentity(PROV, ALPHA.with_salt("s")).chain(TOKENS, 4)]
