"""Errors of the transfer layer (docs/contracts.md 5).

Every transfer fault is a :class:`TransferError` carrying an :class:`ErrorCode`; its message starts
with the code's value (``"checksum_mismatch: block 3 ..."``) so a log line or a ``LoadResult.error``
names the failure. Programming errors (bad arguments, a block id out of range) are ``ValueError`` /
``TypeError``, never a ``TransferError``.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(Enum):
    """Why a transfer failed. The values travel on the wire in ``ErrorReply.code``."""

    TIMEOUT = "timeout"  # no reply (or no bulk completion) within the deadline; peer dead or lost
    PROTOCOL = "protocol"  # malformed / oversized / unexpected message
    BAD_REQUEST = "bad_request"  # the server could not decode the request
    INTERNAL = "internal"  # the server's handler raised
    INCOMPATIBLE = "incompatible"  # handshake: format, provenance, layout or R3 mismatch
    UNKNOWN_TRANSFER = "unknown_transfer"  # the source never exported this id (or forgot it)
    RELEASED = "released"  # already loaded and released (a duplicate load)
    EXPIRED = "expired"  # the source's TTL ran out before the load
    INVALIDATED = "invalidated"  # the source's epoch moved on (weights update) after the export
    STALE_EPOCH = "stale_epoch"  # request or manifest epoch differs from the expected epoch
    STALE_TRANSFER_ID = "stale_transfer_id"  # manifest is for another transfer
    SOURCE_CHANGED = "source_changed"  # manifest from another source instance than the handshake
    KEY_MISMATCH = "key_mismatch"  # block keys differ from the keys the receiver computed
    BAD_MANIFEST = "bad_manifest"  # inconsistent sizes, counts, addresses
    TRUNCATED = "truncated"  # fewer blocks / shorter route records than required
    CHECKSUM_MISMATCH = "checksum_mismatch"  # received bytes differ from the source's checksum
    BULK = "bulk"  # the bulk channel (NIXL) reported an error
    LIMIT = "limit"  # source in-flight count / snapshot bytes limit reached
    BAD_SIGNATURE = "bad_signature"  # an offload unit not signed with this engine's secret


class TransferError(RuntimeError):
    """A transfer fault. ``code`` says which; ``str(err)`` is ``"<code>: <detail>"``."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail


class TransferLimitError(TransferError):
    """Raised by ``KVExporter.export`` when a limit is reached; a request-level error, nothing pinned."""

    def __init__(self, detail: str) -> None:
        super().__init__(ErrorCode.LIMIT, detail)
