"""What the tests of a real ``FleetIngress`` app share: a model directory with a tokenizer (the
ingress routes prompts by their tokens) and a stand-in for the engine deployment's handle that no
request may reach."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))

from serve_helpers import write_tokenizer  # noqa: E402

from execstate.model.random_models import make_random  # noqa: E402


class NoReplicaAsked:
    """The engine deployment's handle where the ingress must answer alone: any use fails the test."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the ingress asked a replica ({name})")


def ingress_model(directory: Path) -> Path:
    """A random MoE with a tokenizer in ``directory``."""
    d = make_random("qwen3_moe", directory, seed=0)
    write_tokenizer(d)
    return d
