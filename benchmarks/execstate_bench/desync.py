"""The desync injection harness: corrupt one side of a piece of state at a time and check that every
injection is detected before use (docs/contracts.md 9, "desync detection": must be 100%).

A *target* is something that keeps or moves state with its control record: an offload tier
(``execstate_bench/offload_desync.py``), a migration offer (``tests/session/test_offer_desync.py``), a
hibernated session (``execstate_bench/hibernation_desync.py``). It implements :class:`DesyncTarget`: for each
kind of desync it supports, one *trial* injects it, asks for the state again and compares what is
served with an oracle (the same request served cold). The harness (:func:`run_trials`) runs every
kind on every target and :func:`detection_table` summarises them per kind.

A trial counts as

- **detected** when the corruption was caught before the state was used (a check failed and the
  corrupted part was not served: the reload stopped before it, the transfer was refused);
- **answered** by ``recompute`` (the request was served from a fresh computation) or ``error``
  (a clear, request-level error), or ``used`` (nothing noticed: the corrupted state was served);
- **wrong** when the tokens or routes served differ from the oracle's (must never happen).

Kinds (``KINDS``; a target names those it can inject): KV bytes of another block, route rows of
another block, a record naming other tokens, another weights version, a truncated unit, a unit
from another tenant's salt, a consistent forgery (bytes and checksums of another block, which only
a signature detects); the hibernated-session kinds (``stale_step``, ``stale_epoch``,
``truncated_manifest``: ``execstate_bench/hibernation_desync.py``) plug in the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

KINDS: dict[str, str] = {
    "kv_other_block": "KV bytes of another block",
    "routes_other_block": "route rows of another block",
    "record_other_tokens": "a record naming other tokens",
    "other_weights": "a unit of another weights version",
    "truncated": "a truncated unit (file, value, route record)",
    "other_tenant": "a unit from another tenant's salt",
    "forged_unit": "another block's bytes with matching checksums, signed with another secret",
    "stale_step": "a hibernated session's state of an older step",
    "stale_epoch": "a hibernated session's state of another event epoch",
    "truncated_manifest": "a truncated hibernated session manifest",
}


@dataclass(frozen=True)
class TrialResult:
    target: str
    kind: str
    detected: bool
    answered: str  # "recompute" | "error" | "used"
    wrong: bool
    detail: str = ""  # what caught it (the failure kind and message), or what went wrong


class DesyncTarget(Protocol):
    """One place state is kept or moved; ``kinds`` it can corrupt; ``trial`` injects one and
    reports. A trial leaves the target usable for the next one."""

    name: str

    def kinds(self) -> Sequence[str]: ...

    def trial(self, kind: str) -> TrialResult: ...


def run_trials(targets: Iterable[DesyncTarget], kinds: Sequence[str] | None = None,
               repeats: int = 1) -> list[TrialResult]:
    """Every kind (or those in ``kinds``) on every target that supports it, ``repeats`` times."""
    out: list[TrialResult] = []
    for target in targets:
        for kind in target.kinds():
            if kinds is not None and kind not in kinds:
                continue
            if kind not in KINDS:
                raise ValueError(f"target {target.name} names an unknown desync kind {kind!r}")
            out.extend(target.trial(kind) for _ in range(repeats))
    return out


@dataclass(frozen=True)
class KindRow:
    kind: str
    targets: tuple[str, ...]
    injected: int
    detected: int
    recompute: int
    error: int
    wrong: int

    @property
    def rate(self) -> float:
        return self.detected / self.injected if self.injected else 0.0


def detection_table(results: Sequence[TrialResult]) -> list[KindRow]:
    rows = []
    for kind in KINDS:
        rs = [r for r in results if r.kind == kind]
        if not rs:
            continue
        rows.append(KindRow(kind, tuple(dict.fromkeys(r.target for r in rs)), len(rs), sum(r.detected for r in rs),
                            sum(r.answered == "recompute" for r in rs), sum(r.answered == "error" for r in rs),
                            sum(r.wrong for r in rs)))
    return rows


def format_detection_table(rows: Sequence[KindRow]) -> str:
    lines = [f"{'desync kind':<22} {'targets':<24} {'injected':>8} {'detected':>8} {'rate':>7} "
             f"{'recompute':>9} {'error':>5} {'wrong':>5}"]
    for r in rows:
        lines.append(f"{r.kind:<22} {','.join(r.targets):<24} {r.injected:>8} {r.detected:>8} {r.rate:>6.0%} "
                     f"{r.recompute:>9} {r.error:>5} {r.wrong:>5}")
    return "\n".join(lines)
