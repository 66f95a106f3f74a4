"""The end-of-turn probe: a logistic regression on the front model's own hidden state.

The speculative step (``agent/prefill.py``) runs the front model over the user's words so far; the
final hidden state at their last token (the final norm applied: the state the model predicts the
next token from; ``SamplingParams.return_hidden``) goes through ``p = sigmoid(w . h + b)``, the
probability that the turn ends there. Like LiveKit's turn detector, but on the model the agent
already runs, for the cost of one dot product.

The weights (``end_probe.safetensors`` beside this module: ``w`` float32 ``[hidden_size]``, ``b``
float32 ``[1]``; a few KB) are trained by ``python -m execstate_bench.end_probe_train`` (seeded:
the project's own generated user turns, whole turns against the same turns cut at word
boundaries; docs/voice.md). Its metadata records the model it was trained on: ``model`` (a name)
and ``weights_version`` (the digest of the loaded tensors, ``model/weights_digest.py``), the
thresholds chosen on the training data for each ``eagerness`` (``threshold_high``,
``threshold_medium``, ``threshold_low``), and the fit's figures. A probe read from another
model's hidden states means nothing, so :func:`select` never applies it to a front whose weights
differ: ``end_score="probe"`` refuses (:class:`EndProbeError`), ``"auto"`` falls back to the
plain end score (the end tokens' probability mass), ``"mass"`` never uses the probe.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

from execstate.errors import CodedError

log = logging.getLogger(__name__)

PROBE_FILE = Path(__file__).with_name("end_probe.safetensors")
END_SCORES = ("auto", "probe", "mass")
EAGERNESS_KEYS = ("high", "medium", "low")


class EndProbeError(CodedError):
    """``code`` ``unsupported``: the probe was trained for another front model (none serves this
    one); ``invalid``: a bad probe file or hidden state."""


@dataclass(frozen=True)
class EndProbe:
    w: np.ndarray  # float64 [hidden_size]
    b: float
    weights_version: str
    meta: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path = PROBE_FILE) -> EndProbe:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = dict(f.metadata() or {})
                w, b = f.get_tensor("w"), f.get_tensor("b")
        except (OSError, KeyError, ValueError) as e:  # missing file or tensor, a corrupt header
            raise EndProbeError("invalid", f"end-of-turn probe {path}: {e}") from e
        if w.ndim != 1 or b.shape != (1,) or not np.isfinite(w).all() or not np.isfinite(b).all():
            raise EndProbeError("invalid", f"end-of-turn probe {path}: w must be [hidden] and b [1], finite")
        if len(meta.get("weights_version", "")) != 64:
            raise EndProbeError("invalid", f"end-of-turn probe {path}: no weights_version in its metadata")
        return cls(w.astype(np.float64), float(b[0]), meta["weights_version"], meta)

    def threshold(self, eagerness: str) -> float:
        """The end threshold chosen on the training data for ``eagerness`` (``auto`` is ``medium``)."""
        key = "medium" if eagerness == "auto" else eagerness
        if key not in EAGERNESS_KEYS:
            raise ValueError(f"eagerness must be one of {(*EAGERNESS_KEYS, 'auto')}, got {eagerness!r}")
        return float(self.meta[f"threshold_{key}"])

    def prob(self, hidden: np.ndarray) -> float:
        """The probability that the turn ends after the token whose final hidden state is ``hidden``."""
        h = np.asarray(hidden, dtype=np.float64)
        if h.shape != self.w.shape or not np.isfinite(h).all():
            raise EndProbeError("invalid", f"hidden state of shape {h.shape} for a probe of {self.w.shape}, finite")
        z = float(h @ self.w) + self.b
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@cache
def shipped() -> EndProbe:
    """The probe shipped with the package (read once)."""
    return EndProbe.load()


def select(end_score: str, weights_version: str | None, probe: EndProbe | None = None) -> EndProbe | None:
    """The probe an agent scores with (None: the plain end score), for ``end_score`` (``auto``,
    ``probe``, ``mass``) and the front's ``weights_version`` (None: unknown, as for a front that
    is not an LM session). ``probe``: the one to check (default: the shipped one)."""
    if end_score not in END_SCORES:
        raise EndProbeError("invalid", f"end_score must be one of {END_SCORES}, got {end_score!r}")
    if end_score == "mass" or (end_score == "auto" and weights_version is None and probe is None):
        return None
    p = probe or shipped()
    if weights_version == p.weights_version:
        return p
    why = (f"the end-of-turn probe was trained for {p.meta.get('model', '?')} (weights {p.weights_version[:12]}), "
           f"the front's weights are {weights_version[:12] if weights_version else 'unknown'}")
    if end_score == "probe":
        raise EndProbeError("unsupported", why + " (end_score='probe'; 'auto' or 'mass' scores with the end tokens)")
    log.info("%s: scoring the end of turn with the end tokens' probability mass", why)
    return None
