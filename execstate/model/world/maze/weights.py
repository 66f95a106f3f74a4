"""Loading the maze world model's network (the world models' common format: ``model.safetensors`` +
``config.json``, ``model/world/weights.py``)."""

from __future__ import annotations

from pathlib import Path

from execstate.model.world.maze.config import MazeModelConfig
from execstate.model.world.maze.network import MazeNet
from execstate.model.world.weights import WEIGHTS_FILE, file_sha256, load_module

__all__ = ["WEIGHTS_FILE", "file_sha256", "load_net"]


def load_net(model_dir: Path) -> MazeNet:
    return load_module(model_dir, MazeModelConfig, MazeNet)
