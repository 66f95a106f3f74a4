"""Checks an offload unit passes before its KV and routes are used (docs/offload.md "Reload").

The same rules as a PD transfer (``checks.py``): the reader computes the keys itself from its own
provenance and tokens and accepts only a unit whose record names exactly them; it recomputes the
checksum of the bytes it is about to use; anything that does not verify is recomputed. (A PD
load checks the bytes that landed in the pool, since NIXL writes there directly; a tier's bytes
are in the reader's hands first, so they are checked before a byte reaches the pool.)

Order (all before the unit's KV is copied into the pool):

1. signature (``BAD_SIGNATURE``): every unit is signed (a shared ring, or the writer's
   per-process key), so a unit another writer made, or re-checksummed, is refused;
2. format version and layout against the reader's pool and route format (``INCOMPATIBLE``);
3. identity: the record's provenance root is the reader's for this request (another weights
   version, device, route mode, tenant or salt names another root) and its key is the expected
   key (``KEY_MISMATCH``);
4. record: its parent and tokens are the expected ones and ``block_key(parent, tokens) == key``
   (``KEY_MISMATCH``);
5. routes: present when the reader returns routes, their checksum, shape, expert range and no
   duplicate in a row (``CHECKSUM_MISMATCH`` / ``TRUNCATED``);
6. KV: ``checksum`` of the unit's KV bytes equals ``kv_checksum`` (``CHECKSUM_MISMATCH``).

Each failure is a :class:`UnitCheckError` whose ``kind`` (``format``, ``signature``, ``identity``,
``record``, ``routes``, ``checksum``) is what the tier metrics and the desync table count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from execstate.identity.checksum import checksum
from execstate.identity.keys import BlockKey, block_key
from execstate.identity.secret_ring import SecretRing
from execstate.state.tiers.unit import FORMAT_VERSION, UnitLayout, UnitRecord, tag_valid
from execstate.transfer.errors import ErrorCode, TransferError

KINDS = ("format", "signature", "identity", "record", "routes", "checksum")


class UnitCheckError(TransferError):
    def __init__(self, kind: str, code: ErrorCode, detail: str) -> None:
        super().__init__(code, detail)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ExpectedUnit:
    """What the reader computed for one block: its key, parent, provenance root and tokens."""

    key: BlockKey
    parent: BlockKey
    root: BlockKey
    token_ids: tuple[int, ...]


def verify_record(record: UnitRecord, want: ExpectedUnit, layout: UnitLayout, need_routes: bool,
                  ring: SecretRing) -> None:
    """Raise :class:`UnitCheckError` unless ``record`` may serve ``want`` (steps 1-4 and the
    presence of routes; module docstring)."""
    if not tag_valid(record, ring):
        raise UnitCheckError("signature", ErrorCode.BAD_SIGNATURE,
                             "the unit is not signed with a key this engine accepts (another writer, or forged)")
    if record.format_version != FORMAT_VERSION:
        raise UnitCheckError("format", ErrorCode.INCOMPATIBLE,
                             f"unit format {record.format_version}, reader {FORMAT_VERSION}")
    kv_layout = (record.layout.num_layers, record.layout.block_size, record.layout.num_kv_heads,
                 record.layout.head_dim, record.layout.dtype)
    if kv_layout != (layout.num_layers, layout.block_size, layout.num_kv_heads, layout.head_dim, layout.dtype):
        raise UnitCheckError("format", ErrorCode.INCOMPATIBLE, f"unit layout {record.layout}, pool {layout}")
    if record.root != want.root:
        raise UnitCheckError("identity", ErrorCode.KEY_MISMATCH,
                             "the unit was computed under another execution identity (weights version, "
                             f"numerics, route mode, tenant or salt): root {record.root.hex()[:16]}, "
                             f"expected {want.root.hex()[:16]}")
    if record.key != want.key:
        raise UnitCheckError("identity", ErrorCode.KEY_MISMATCH,
                             f"unit key {record.key.hex()[:16]} stored under {want.key.hex()[:16]}")
    if record.parent != want.parent or tuple(record.token_ids) != want.token_ids:
        raise UnitCheckError("record", ErrorCode.KEY_MISMATCH, "the record names another parent or other tokens")
    if block_key(record.parent, record.token_ids) != record.key:
        raise UnitCheckError("record", ErrorCode.KEY_MISMATCH, "the record's parent and tokens do not hash to its key")
    if need_routes and (record.routes_checksum is None or record.layout.routes_nbytes == 0):
        raise UnitCheckError("routes", ErrorCode.TRUNCATED, "routes are needed but the unit carries none")
    if need_routes and (record.layout.route_layers, record.layout.route_top_k) != (
            layout.route_layers, layout.route_top_k):
        raise UnitCheckError("format", ErrorCode.INCOMPATIBLE, f"unit route format {record.layout}, reader {layout}")


def verify_routes(record: UnitRecord, routes: bytes | memoryview | None, n_experts: int | None) -> np.ndarray:
    """The unit's route rows ``int16 [block_size, route_layers, route_top_k]`` (a copy), checked
    against ``routes_checksum`` and the R3 contract (ids in ``[0, n_experts)``, none twice in a
    row); :class:`UnitCheckError` (``routes``) otherwise."""
    lay = record.layout
    if routes is None or record.routes_checksum is None or len(routes) != lay.routes_nbytes:
        raise UnitCheckError("routes", ErrorCode.TRUNCATED, "route rows missing or truncated")
    if checksum(routes) != record.routes_checksum:
        raise UnitCheckError("routes", ErrorCode.CHECKSUM_MISMATCH, "route rows differ from the record's checksum")
    rows = np.frombuffer(routes, dtype="<i2").reshape(lay.block_size, lay.route_layers, lay.route_top_k)
    rows = rows.astype(np.int16)
    if n_experts is not None and rows.size and (rows.min() < 0 or rows.max() >= n_experts):
        raise UnitCheckError("routes", ErrorCode.CHECKSUM_MISMATCH, f"expert ids outside [0, {n_experts})")
    s = np.sort(rows, axis=-1)
    if (s[..., 1:] == s[..., :-1]).any():
        raise UnitCheckError("routes", ErrorCode.CHECKSUM_MISMATCH, "a route row names one expert twice")
    return rows


def kv_mismatch(record: UnitRecord, digest: bytes) -> UnitCheckError | None:
    """The error for KV bytes whose ``checksum`` is ``digest``, or None when they verify."""
    if digest == record.kv_checksum:
        return None
    return UnitCheckError("checksum", ErrorCode.CHECKSUM_MISMATCH,
                          "the KV bytes differ from the record's checksum")
