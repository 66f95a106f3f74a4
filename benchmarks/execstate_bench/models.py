"""Which model a benchmark runs: ``standard``, an embedded model's name, or a directory.

``standard`` is the standard benchmark MoE (``make_standard_moe``, seed 0), built into the
user cache on first use and reused afterwards; an embedded name resolves through the model
registry (prepared on first use); anything else that is a directory is used as is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

STANDARD = "standard"
STANDARD_DIRNAME = "standard-moe"
STANDARD_SEED = 0


def standard_model_dir() -> Path:
    try:
        from execstate.paths import model_dir

        return model_dir(STANDARD_DIRNAME)
    except ImportError:  # pragma: no cover - paths.py exists in this tree
        return Path.home() / ".cache" / "execstate" / "models" / STANDARD_DIRNAME


def ensure_standard_model() -> Path:
    """Build the standard benchmark model into the user cache once (atomic rename)."""
    out = standard_model_dir()
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    from execstate.model.random_models import make_standard_moe

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    make_standard_moe(tmp, seed=STANDARD_SEED)
    if out.exists():  # built concurrently by someone else
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    os.replace(tmp, out)
    return out


def resolve_bench_model(model: str | Path) -> Path:
    """The directory of ``model`` (see the module docstring); may build or prepare it."""
    if str(model) == STANDARD:
        return ensure_standard_model()
    p = Path(model).expanduser()
    if p.is_dir():
        return p
    from execstate.model.registry import resolve_model

    return Path(resolve_model(str(model)))


def count_parameters(model_dir: Path) -> int:
    """Number of stored weights (tied tensors once) from the safetensors headers."""
    from safetensors import safe_open

    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                total += int(np.prod(sf.get_slice(name).get_shape()))
    return total
