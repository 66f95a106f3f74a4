"""Provenance: the identity of the execution that produces state (DESIGN.md 2).

A :class:`Provenance` names everything besides the tokens that determines the bytes of a KV
block and its route record: the model, the exact weights, the dtype, the numerics mode, the MoE
route mode and the tenant's cache salt. Its canonical encoding is the root of every block key
(:func:`execstate.identity.keys.root_key`), so changing any field changes every key derived from
it, and state computed under one provenance can never hit a request running under another.

Contracts:

- The encoding is canonical and versioned: UTF-8 JSON with sorted keys, fixed separators, no
  whitespace, no floats, and a ``"v"`` format version. Equal provenances give equal bytes on every
  process and machine; nothing depends on ``PYTHONHASHSEED`` or dict order.
- ``cache_salt=None`` means "no salt" and encodes as JSON ``null``; an empty salt is rejected so
  that "absent" has exactly one spelling.
- Instances are immutable and validated on construction (``ValueError`` / ``TypeError``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

ENCODING_VERSION = 1
DOMAIN_PROVENANCE = b"execstate/v1/provenance"
NUMERICS_MODES = ("eager", "compiled")
_KERNEL_SET_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
ROUTE_MODES = ("free", "replayed")


def _check_utf8(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (e.g. from a JSON "\ud800") cannot be encoded
        raise ValueError(f"Provenance.{name} is not valid UTF-8 text") from None


@dataclass(frozen=True)
class Provenance:
    """Identity of an execution; see the module docstring for the encoding contract.

    Fields:
        model_id: the model's name or path as loaded (e.g. ``"Qwen/Qwen3-30B-A3B"``).
        weights_version: digest of the loaded tensors (64 hex digits), or ``"user:<version>"``
            when a trainer supplied the version of an update; re-bound on every weight update.
        dtype: compute dtype name (e.g. ``"bfloat16"``).
        numerics: ``"eager"`` or ``"compiled"``, optionally ``+<kernel set>`` when custom
            kernels replace some torch ops (e.g. ``"eager+cpu-avx2-v1"``): they round
            differently, so their state must not be mixed with torch-only state.
        route_mode: ``"free"`` (router picks top-k) or ``"replayed"`` (routes given).
        cache_salt: tenant isolation salt, ``None`` when the cache is shared (the engine-wide
            salt, or a request's own, which replaces it in that request's root).
    """

    model_id: str
    weights_version: str
    dtype: str
    numerics: str
    route_mode: str
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        for name in ("model_id", "weights_version", "dtype", "numerics", "route_mode"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"Provenance.{name} must be str, got {type(value).__name__}")
            if not value:
                raise ValueError(f"Provenance.{name} must be non-empty")
            _check_utf8(name, value)
        mode, plus, kernel_set = self.numerics.partition("+")
        if mode not in NUMERICS_MODES or (plus and not (kernel_set and set(kernel_set) <= _KERNEL_SET_CHARS)):
            raise ValueError(f"Provenance.numerics must be one of {NUMERICS_MODES}, optionally followed by "
                             f"'+<kernel set>' ([a-z0-9.-]), got {self.numerics!r}")
        if self.route_mode not in ROUTE_MODES:
            raise ValueError(f"Provenance.route_mode must be one of {ROUTE_MODES}, got {self.route_mode!r}")
        if self.cache_salt is not None:
            if not isinstance(self.cache_salt, str):
                raise TypeError(
                    f"Provenance.cache_salt must be str or None, got {type(self.cache_salt).__name__}"
                )
            if not self.cache_salt:
                raise ValueError("Provenance.cache_salt must be None (no salt) or a non-empty string")
            _check_utf8("cache_salt", self.cache_salt)

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
