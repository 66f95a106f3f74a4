"""Provenance: what an engine computes with (the engine-wide half of an execution's identity).

A :class:`Provenance` names everything about the engine that determines the bytes of a KV block
and its route record besides the tokens: the model, the exact weights, the dtype and the
numerics, which names the device and the kernel family (``eager+cpu-avx2-v1``,
``eager+cpu-torch-v1``, ``eager+cuda-sm90-triton-v1``): the same arithmetic on another device or
with other kernels rounds differently, so its state is another execution's. The request-level half
(route mode, tenant scope, salt) joins it in :class:`execstate.identity.execution.ExecutionIdentity`,
the one value every key is derived from.

Contracts:

- The encoding is canonical and versioned: UTF-8 JSON with sorted keys, fixed separators, no
  whitespace, no floats, and a ``"v"`` format version. Equal provenances give equal bytes on every
  process and machine; nothing depends on ``PYTHONHASHSEED`` or dict order.
- ``numerics`` is ``<mode>+<kernel family>``: the family is never implied.
- Instances are immutable and validated on construction (``ValueError`` / ``TypeError``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

ENCODING_VERSION = 2
DOMAIN_PROVENANCE = b"execstate/v1/provenance"
NUMERICS_MODES = ("eager", "compiled")
_KERNEL_SET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
MAX_FIELD_CHARS = 512


def numerics_id(mode: str, kernel_family: str) -> str:
    """The numerics field for ``mode`` (``eager`` | ``compiled``) on ``kernel_family``
    (e.g. ``cpu-avx2-v1``, ``cuda-sm90-triton-v1``); validated like a :class:`Provenance` field."""
    value = f"{mode}+{kernel_family}"
    _check_numerics(value)
    return value


def _check_numerics(value: str) -> None:
    mode, plus, family = value.partition("+")
    if mode not in NUMERICS_MODES or not plus or not family or not set(family) <= _KERNEL_SET_CHARS:
        raise ValueError(f"Provenance.numerics must be '<mode>+<kernel family>' with mode one of {NUMERICS_MODES} "
                         f"and the family in [a-z0-9.-] (e.g. 'eager+cpu-torch-v1'), got {value!r}")


def _check_utf8(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (e.g. from a JSON "\ud800") cannot be encoded
        raise ValueError(f"Provenance.{name} is not valid UTF-8 text") from None


@dataclass(frozen=True)
class Provenance:
    """What an engine computes with; see the module docstring for the encoding contract.

    Fields:
        model_id: the model's name or path as loaded (e.g. ``"Qwen/Qwen3-30B-A3B"``).
        weights_version: digest of the loaded tensors (64 hex digits), or ``"user:<version>"``
            when a trainer supplied the version of an update; re-bound on every weight update.
        dtype: compute dtype name (e.g. ``"bfloat16"``).
        numerics: ``<mode>+<kernel family>`` (:func:`numerics_id`), e.g. ``"eager+cpu-avx2-v1"``.
    """

    model_id: str
    weights_version: str
    dtype: str
    numerics: str

    def __post_init__(self) -> None:
        for name in ("model_id", "weights_version", "dtype", "numerics"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"Provenance.{name} must be str, got {type(value).__name__}")
            if not value or len(value) > MAX_FIELD_CHARS:
                raise ValueError(f"Provenance.{name} must be 1-{MAX_FIELD_CHARS} characters, got {len(value)}")
            _check_utf8(name, value)
        _check_numerics(self.numerics)

    def encode(self) -> bytes:
        """Canonical bytes of this provenance (format version ``ENCODING_VERSION``)."""
        doc: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        doc["v"] = ENCODING_VERSION
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def digest(self) -> str:
        """sha256 hex of the encoding under the domain tag ``DOMAIN_PROVENANCE``.

        Used where a provenance must be compared across processes (PD manifests, checkpoints).
        """
        payload = self.encode()
        h = hashlib.sha256()
        for part in (DOMAIN_PROVENANCE, payload):
            h.update(len(part).to_bytes(8, "little"))
            h.update(part)
        return h.hexdigest()

    def replace(self, **changes: Any) -> Provenance:
        """A copy with ``changes`` applied (validated like a new instance)."""
        return dataclasses.replace(self, **changes)
