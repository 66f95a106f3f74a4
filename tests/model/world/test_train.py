"""Training: a tiny run reduces the loss, and the same seed gives the same weights (hash)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from conftest import TINY

from execstate.model.world import data, teacher
from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.model import ChunkedWorldModel
from execstate.model.world.train import TrainConfig, train, train_to_dir

FAST = TrainConfig(seed=3, steps=60, batch_size=2, lr=1e-2, warmup=5, threads=1)


def _held_out_loss(net: torch.nn.Module, t_value: float = 0.5) -> float:
    """The training objective on unseen data at one flow time, without the sink chunk (generated
    from nothing; training weighs it x0.05)."""
    batch = data.sample_batch(np.random.default_rng(999), TINY, 8)
    g = torch.Generator().manual_seed(0)
    t = torch.full(batch.latents.shape[:2], t_value)
    with torch.no_grad():
        pred = teacher.predict(net, batch, t, torch.randn(batch.latents.shape, generator=g))
    w = (1 + 4 * batch.changed.float())[:, 1:]
    return float(LatentCodec(net.cfg).loss(pred[:, 1:], batch.latents[:, 1:], w))


def test_tiny_training_reduces_the_loss_and_is_deterministic(tmp_path: Path) -> None:
    torch.manual_seed(FAST.seed)
    from execstate.model.world.transformer import WorldTransformer

    untrained = _held_out_loss(WorldTransformer(TINY).eval())  # = copying the frame before (residual)
    a = train_to_dir(tmp_path / "a", TINY, FAST, extra={"command": "test"})
    b = train_to_dir(tmp_path / "b", TINY, FAST)
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["stats"]["losses"] == b["stats"]["losses"]
    assert json.loads((tmp_path / "a" / "train.json").read_text())["command"] == "test"
    model = ChunkedWorldModel.load(tmp_path / "a")
    assert model.spec.weights_version == a["weights_sha256"]
    trained = _held_out_loss(model.net)
    assert trained < 0.97 * untrained, (untrained, trained)  # measured 0.95 (the gated head starts slowly)
    untrained0, trained0 = _held_out_loss(WorldTransformer(TINY).eval(), 0.0), _held_out_loss(model.net, 0.0)
    assert trained0 < untrained0, (untrained0, trained0)  # from pure noise: better than copying
    other, _ = train(TINY, TrainConfig(**{**FAST.__dict__, "seed": 4}))
    assert not torch.equal(other.patch_out.weight, model.net.patch_out.weight)
