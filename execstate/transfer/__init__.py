"""Transfer layer: one protocol for every move of state (docs/contracts.md 5).

Control state (a small :class:`~execstate.transfer.manifest.Manifest`) travels on a ZeroMQ control
channel (:mod:`~execstate.transfer.control`); KV bytes travel on a NIXL/UCX bulk channel
(:mod:`~execstate.transfer.bulk`). The source pins and snapshots (:mod:`~execstate.transfer.exporter`),
the receiver fetches, verifies and commits only what verified (:mod:`~execstate.transfer.importer`),
with the checks of :mod:`~execstate.transfer.checks`, on the receiver's transfer thread
(:mod:`~execstate.transfer.load_worker`); who may hand state over: :mod:`~execstate.transfer.handoff`.
The fault-injecting importer of the tests and benchmarks is not here: ``benchmarks/execstate_bench/faults.py``.
"""

from execstate.transfer.errors import ErrorCode, TransferError, TransferLimitError
from execstate.transfer.manifest import (
    FORMAT_VERSION,
    BlockEntry,
    Capabilities,
    KVLayout,
    Manifest,
    R3Format,
)

__all__ = [
    "FORMAT_VERSION",
    "BlockEntry",
    "Capabilities",
    "ErrorCode",
    "KVLayout",
    "Manifest",
    "R3Format",
    "TransferError",
    "TransferLimitError",
]
