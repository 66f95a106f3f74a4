"""Byte layouts of every key: roots, blocks and the extra keys of a block.

A block's key is ``H(parent_key, token_ids_of_block, extra)``; the first block's parent is the
root of the execution's identity (``identity/execution.py``: the only place that builds a root or
a chain), so every key inherits the whole identity. A prefix-cache hit requires an equal key.
All keys are raw 32-byte sha256 digests (:data:`BlockKey`).

Byte layout (all integers little-endian; ``u64(x)`` is 8 bytes):

- root:  ``sha256(u64(len(DOMAIN_ROOT)) DOMAIN_ROOT u64(len(enc)) enc)`` with ``enc`` the
  identity's canonical encoding (:func:`root_from_encoding`).
- block: ``sha256(u64(len(DOMAIN_BLOCK)) DOMAIN_BLOCK parent[32] u64(n) tok[0..n) as int64 X)``
  where ``X = 0x00`` when ``extra is None`` and ``X = 0x01 u64(len(extra)) extra`` otherwise,
  so an absent extra and an empty one give different keys.
- forced routes (the extra of a block whose routes a request forces, :func:`routes_extra`):
  ``sha256(u64(len(DOMAIN_ROUTES)) DOMAIN_ROUTES u64(rows) u64(layers) u64(top_k) r as int64)``
  over the block's rows ``r`` (``[rows, layers, top_k]``, C order).

Never Python ``hash()``: keys are equal across processes, machines and ``PYTHONHASHSEED`` values.
Changing a layout changes every key; ``tests/identity/`` pins golden values against a second
implementation so it cannot change by accident.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import NewType

import numpy as np

BlockKey = NewType("BlockKey", bytes)
"""32-byte sha256 digest identifying one full block (and, transitively, its whole prefix)."""

KEY_BYTES = 32
DOMAIN_BLOCK = b"execstate/v1/block"
DOMAIN_ROOT = b"execstate/v2/root"
DOMAIN_ROUTES = b"execstate/v1/forced-routes"

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
_ROUTES_HASHER = _domain_hasher(DOMAIN_ROUTES)


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


def root_from_encoding(encoding: bytes) -> BlockKey:
    """The root key of an identity whose canonical encoding is ``encoding``."""
    h = _ROOT_HASHER.copy()
    h.update(_u64(len(encoding)))
    h.update(encoding)
    return BlockKey(h.digest())


def routes_extra(rows: np.ndarray) -> bytes:
    """The extra key of a block whose routes are forced: a digest of its ``[rows, layers, top_k]``
    route rows (module docstring). ``ValueError`` unless ``rows`` is a 3-D integer array."""
    if not isinstance(rows, np.ndarray) or rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise ValueError(f"forced route rows must be a 3-D integer array, got {getattr(rows, 'shape', rows)!r}")
    h = _ROUTES_HASHER.copy()
    for dim in rows.shape:
        h.update(_u64(dim))
    h.update(np.ascontiguousarray(rows, dtype="<i8").tobytes())
    return h.digest()


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
