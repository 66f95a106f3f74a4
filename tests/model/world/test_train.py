"""Training: a tiny run reduces the loss, and the same seed gives the same weights (hash)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY

from execstate.model.world.latent_codec import LatentCodec
from execstate.model.world.model import ChunkedWorldModel
from execstate_bench.world_tools import data, teacher
from execstate_bench.world_tools.train import TrainConfig, train, train_to_dir

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


def test_the_local_stage_trains_the_conv_path_alone_and_hands_over_exactly() -> None:
    """``local_steps``: the first stage changes only the convolutional path (stem, head, carry
    gains), lowers its loss, and leaves the transformer's output at zero, so the full model
    starts the second stage predicting exactly what the conv path alone predicts."""
    import dataclasses

    from execstate.model.world.transformer import WorldTransformer

    cfg = dataclasses.replace(TINY, codec="palette", cell_size=4, action_shift_px=1, conv_channels=8, conv_layers=3,
                              conv_keys=True, conv_prev_frame=True)
    tc = TrainConfig(seed=5, steps=0, local_steps=40, local_batch_size=2, lr=1e-2, warmup=5, threads=1)
    net, stats = train(cfg, tc, log_every=10)
    torch.manual_seed(tc.seed)
    fresh = WorldTransformer(cfg)
    local = ("stem.", "head.", "copy_gain", "shift_gain")
    trained = dict(net.named_parameters())
    for name, p in fresh.named_parameters():
        assert torch.equal(p, trained[name]) != name.startswith(local), name
    assert stats["local_losses"][-1] < 0.8 * stats["local_losses"][0], stats["local_losses"]
    batch = data.sample_batch(np.random.default_rng(11), cfg, 2)
    g = torch.Generator().manual_seed(1)
    t = torch.rand(batch.latents.shape[:2], generator=g)
    noise = torch.randn(batch.latents.shape, generator=g)
    with torch.no_grad():
        full = teacher.predict(net, batch, t, noise)
        alone = teacher.predict(net, batch, t, noise, local_only=True)
    torch.testing.assert_close(full, alone, atol=1e-5, rtol=1e-5)
    again, _ = train(cfg, tc, log_every=10)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), net.parameters(), strict=True))
    # conv_lr_scale = 0: the second stage trains the transformer on top of a frozen conv path
    frozen, _ = train(cfg, dataclasses.replace(tc, steps=3, conv_lr_scale=0.0), log_every=10)
    for name, p in frozen.named_parameters():
        assert torch.equal(p, trained[name]) == name.startswith(local), name
    with pytest.raises(ValueError, match="conv_channels"):
        train(TINY, TrainConfig(steps=0, local_steps=2))


def test_world_train_without_flags_trains_the_default_recipe(tmp_path: Path) -> None:
    """``execstate world train --out DIR`` = ``execstate models prepare world`` (the recipe's model
    and train configs, so the same weights), and the recorded command line gives them back."""
    import shlex

    from execstate.cli import build_parser
    from execstate.model.world import recipe
    from execstate.model.world.config import WorldModelConfig
    from execstate_bench.world_tools.cli import train_configs

    parser = build_parser()
    model_cfg, cfg, command = train_configs(parser.parse_args(["world", "train", "--out", str(tmp_path)]))
    assert model_cfg == WorldModelConfig.from_dict(recipe.PARAMS["model"])
    assert cfg == TrainConfig(**recipe.PARAMS["train"])
    again = train_configs(parser.parse_args(shlex.split(command)[1:]))
    assert again == (model_cfg, cfg, command)
    custom = train_configs(parser.parse_args(["world", "train", "--out", "x", "--schedule", "0,0.5", "--no-conv-keys",
                                              "--local-steps", "7"]))
    assert (custom[0].schedule, custom[0].conv_keys, custom[1].local_steps) == ((0.0, 0.5), False, 7)
