"""One weight update in progress: its validated copy plan, its policy and the requests it waits for.

The engine drives it (``LLMEngine.begin_weight_update``); this module holds the state and
the rules, and no engine:

- **Version.** The new weights version becomes the provenance field ``weights_version``
  and so the root of every block key (docs/contracts.md 2). With no ``weights_version`` given, it
  is the digest of the loaded tensors (``model.weights_digest``: 64 lowercase hex digits,
  about 0.3 s per 400 MB). A trainer-supplied version (a non-empty string of at most
  ``MAX_WEIGHTS_VERSION_CHARS`` characters) is bound as ``"user:" + version`` with no
  hashing: the prefix keeps it from ever equalling a digest (a digest has no ``:``). The
  caller promises that one version names one set of weights; an engine refuses a supplied
  version it has already been under (reusing one could make old units hit).
- **Policies.** ``abort``: every request in flight is finished with ``finish_reason
  "abort"`` and the weights switch at once. ``drain``: the requests in flight (running and
  waiting) finish on the old weights while admission of newer requests is held; when the
  last of them finishes, the weights switch and the newer requests run on the new weights.
- **Switch.** Copy in place (``WeightCopyPlan.apply``), bind the version, re-root the
  keys: no old unit (KV block or route record) can be hit afterwards.

Lifecycle: created validated (nothing changed yet) → ``drained`` once every request it
waits for has finished → ``finish`` once switched (``done``), exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, cast

from execstate.engine.outputs import RequestOutput
from execstate.engine.request import Request
from execstate.model.weight_copy import WeightCopyPlan

UpdatePolicy = Literal["abort", "drain"]
POLICIES: tuple[str, ...] = ("abort", "drain")
MAX_WEIGHTS_VERSION_CHARS = 256
USER_VERSION_PREFIX = "user:"


def supplied_version(weights_version: object, seen: set[str]) -> str | None:
    """The provenance value for a trainer-supplied ``weights_version`` (``None``: hash the
    weights). Raises ``ValueError`` naming ``weights_version`` when it is not a non-empty
    string of at most ``MAX_WEIGHTS_VERSION_CHARS`` characters, is not UTF-8 encodable, or
    its provenance value is in ``seen`` (versions this engine has already been under)."""
    if weights_version is None:
        return None
    if not isinstance(weights_version, str) or not weights_version:
        raise ValueError(f"weights_version must be a non-empty string, got {weights_version!r}")
    if len(weights_version) > MAX_WEIGHTS_VERSION_CHARS:
        raise ValueError(f"weights_version has {len(weights_version)} characters; at most "
                         f"{MAX_WEIGHTS_VERSION_CHARS} allowed")
    try:
        weights_version.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("weights_version is not valid UTF-8 text") from None
    value = USER_VERSION_PREFIX + weights_version
    if value in seen:
        raise ValueError(f"weights_version {weights_version!r} was already used by this engine; each update "
                         "needs a new version (a cached unit of the old weights would otherwise hit)")
    return value


def check_policy(policy: object) -> UpdatePolicy:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return cast(UpdatePolicy, policy)  # one of POLICIES


@dataclass(frozen=True)
class WeightUpdateResult:
    """What an update did: the bound provenance version and what happened to the requests."""

    weights_version: str
    policy: UpdatePolicy
    num_aborted: int
    num_drained: int
    switch_seconds: float  # copy + version (hash when none was supplied) + re-root


@dataclass(eq=False)
class WeightUpdate:
    plan: WeightCopyPlan
    version: str | None  # provenance value of a supplied version; None: hash after copying
    policy: UpdatePolicy
    # Requests in flight at the update that must finish first (drain); empty for abort.
    waits_for: list[Request] = field(default_factory=list)
    # Final outputs of the requests the update aborted (abort policy).
    aborted: list[RequestOutput] = field(default_factory=list)
    result: WeightUpdateResult | None = None

    @property
    def drained(self) -> bool:
        return all(r.is_finished for r in self.waits_for)

    @property
    def done(self) -> bool:
        return self.result is not None

    def finish(self, weights_version: str, switch_seconds: float) -> WeightUpdateResult:
        if self.result is not None:
            raise RuntimeError("a weight update finishes exactly once")
        self.result = WeightUpdateResult(
            weights_version, self.policy, len(self.aborted), len(self.waits_for), switch_seconds
        )
        return self.result
