"""Block keys: chained, provenance-rooted content hashes of full KV blocks (docs/ARCHITECTURE.md 2).

A block's key is ``H(parent_key, token_ids_of_block, extra)``; the first block's parent is the
provenance root key, so every key inherits the provenance. A prefix-cache hit requires an equal
key. All keys are raw 32-byte sha256 digests (:data:`BlockKey`).

Byte layout (all integers little-endian; ``u64(x)`` is 8 bytes):

- root:  ``sha256(u64(len(DOMAIN_ROOT)) DOMAIN_ROOT u64(len(enc)) enc)`` with
  ``enc = prov.encode()``.
- block: ``sha256(u64(len(DOMAIN_BLOCK)) DOMAIN_BLOCK parent[32] u64(n) tok[0..n) as int64 X)``
  where ``X = 0x00`` when ``extra is None`` and ``X = 0x01 u64(len(extra)) extra`` otherwise,
  so an absent extra and an empty one give different keys.

Never Python ``hash()``: keys are equal across processes, machines and ``PYTHONHASHSEED`` values.
Changing this layout changes every key; ``tests/identity/test_provenance_keys.py`` pins a golden
value so it cannot change by accident.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import NewType

import numpy as np

from execstate.identity.provenance import Provenance

BlockKey = NewType("BlockKey", bytes)
"""32-byte sha256 digest identifying one full block (and, transitively, its whole prefix)."""

KEY_BYTES = 32
DOMAIN_BLOCK = b"execstate/v1/block"
DOMAIN_ROOT = b"execstate/v1/root"

_INT64_MAX = np.iinfo(np.int64).max
_NO_EXTRA = b"\x00"
_HAS_EXTRA = b"\x01"


def _u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


def _domain_hasher(domain: bytes) -> hashlib._Hash:
    h = hashlib.sha256()
    h.update(_u64(len(domain)))
    h.update(domain)
    return h


_ROOT_HASHER = _domain_hasher(DOMAIN_ROOT)
_BLOCK_HASHER = _domain_hasher(DOMAIN_BLOCK)


def _pack_tokens(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids as contiguous little-endian int64 bytes; rejects non-integers and overflow."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1:
            raise ValueError(f"token_ids must be 1-D, got shape {token_ids.shape}")
        if token_ids.dtype.kind not in "iu":
            raise TypeError(f"token_ids must have an integer dtype, got {token_ids.dtype}")
        if token_ids.dtype == np.uint64 and token_ids.size and int(token_ids.max()) > _INT64_MAX:
            raise OverflowError("token id does not fit in int64")
        return token_ids.astype("<i8", copy=False).tobytes()
    packed = array("q", token_ids)  # TypeError on non-integers, OverflowError outside int64
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def check_key(key: bytes, what: str = "key") -> None:
    """Raise ``TypeError``/``ValueError`` unless ``key`` is a 32-byte ``bytes`` (a :data:`BlockKey`)."""
    if not isinstance(key, bytes):
        raise TypeError(f"{what} must be bytes, got {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise ValueError(f"{what} must be {KEY_BYTES} bytes, got {len(key)}")


def _hash_block(
    parent: bytes, n_tokens: int, token_bytes: bytes | memoryview, extra: bytes | None
) -> BlockKey:
    h = _BLOCK_HASHER.copy()
    h.update(parent)
    h.update(_u64(n_tokens))
    h.update(token_bytes)
    if extra is None:
        h.update(_NO_EXTRA)
    else:
        h.update(_HAS_EXTRA)
        h.update(_u64(len(extra)))
        h.update(extra)
    return BlockKey(h.digest())


def root_key(prov: Provenance) -> BlockKey:
    """Parent key of a sequence's first block: a digest of ``prov``'s canonical encoding."""
    enc = prov.encode()
    h = _ROOT_HASHER.copy()
    h.update(_u64(len(enc)))
    h.update(enc)
    return BlockKey(h.digest())


def block_key(
    parent: BlockKey, token_ids: Sequence[int] | np.ndarray, extra: bytes | None = None
) -> BlockKey:
    """Key of one block with ``token_ids`` whose predecessor has key ``parent``.

    ``token_ids`` must be non-empty integers within int64; ``extra`` carries any further
    identity of the block (e.g. multimodal content hashes, a LoRA id), ``None`` when absent.
    Pure function: no side effects, same result in every process.
    """
    check_key(parent, "parent")
    packed = _pack_tokens(token_ids)
    if not packed:
        raise ValueError("a block has at least one token")
    if extra is not None and not isinstance(extra, bytes):
        raise TypeError(f"extra must be bytes or None, got {type(extra).__name__}")
    return _hash_block(parent, len(packed) // 8, packed, extra)


def chain_keys(
    prov: Provenance,
    token_ids: Sequence[int] | np.ndarray,
    block_size: int,
    extras: Sequence[bytes | None] | None = None,
) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids`` (a trailing partial block gets no key).

    ``keys[i] == block_key(keys[i - 1], token_ids[i*bs:(i+1)*bs], extras[i])`` with
    ``keys[-1]`` read as ``root_key(prov)``. ``extras``, when given, has one entry per block:
    either one per full block, or one per block including the partial tail (whose entry is
    ignored); any other length raises ``ValueError``. Keys of a prefix are a prefix of the keys.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    packed = _pack_tokens(token_ids)
    n_tokens = len(packed) // 8
    n_full = n_tokens // block_size
    if extras is not None:
        n_blocks = -(-n_tokens // block_size)
        if len(extras) not in (n_full, n_blocks):
            raise ValueError(
                f"extras has {len(extras)} entries; expected {n_full} (full blocks) or {n_blocks}"
            )
        for i in range(n_full):
            if extras[i] is not None and not isinstance(extras[i], bytes):
                raise TypeError(f"extras[{i}] must be bytes or None, got {type(extras[i]).__name__}")
    view = memoryview(packed)
    step = block_size * 8
    parent = root_key(prov)
    keys: list[BlockKey] = []
    for i in range(n_full):
        parent = _hash_block(
            parent, block_size, view[i * step : (i + 1) * step], None if extras is None else extras[i]
        )
        keys.append(parent)
    return keys
