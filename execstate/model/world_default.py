"""The default world models: where their weights come from, and loading them.

``world`` (the grid world's model) has two sources, in this order:

1. the prepared model in the cache (``execstate models prepare world``: the default recipe trained
   on this machine into ``paths.model_dir("world")``), when :func:`registry.is_prepared` says it is
   complete and matches the current recipe;
2. the weights shipped in the package (``execstate/model/world/shipped/``: the same recipe,
   trained once by ``execstate models prepare world`` and stored in bf16, a few MB), so that tests,
   CI, the runtime and the browser page work on a fresh clone without training.

``weights_version`` of the loaded model is the sha256 of the weights file it was loaded from
(the two sources differ, so they never share cached state). The loaded network computes in fp32
whatever the storage dtype.

``maze`` (the first-person maze's model): the weights shipped in the package
(``execstate/model/world/maze/shipped/``, fp16): the state model of maze 3, trained by
``python -m execstate_bench.world_tools.maze_state_train``.

:func:`load_world_dir` loads a trained directory of either kind (the config's fields say which).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from execstate.model.world.model import ChunkedWorldModel

SHIPPED_DIR = Path(__file__).parent / "world" / "shipped"
MAZE_SHIPPED_DIR = Path(__file__).parent / "world" / "maze" / "shipped"
MODEL_NAME = "world"
MAZE_NAME = "maze"
DEFAULT_WORLDS = (MODEL_NAME, MAZE_NAME)


def default_world_model_dir(prefer_prepared: bool = True) -> Path:
    """The directory the default model loads from: the prepared cache if valid (and
    ``prefer_prepared``), else the shipped weights."""
    if prefer_prepared:
        from execstate import paths
        from execstate.model import registry

        if registry.is_prepared(MODEL_NAME):
            return paths.model_dir(MODEL_NAME)
    if not (SHIPPED_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(f"no shipped world model weights in {SHIPPED_DIR}; "
                                "run `execstate models prepare world`")
    return SHIPPED_DIR


def load_default_world_model(numerics: str = "eager", prefer_prepared: bool = True) -> ChunkedWorldModel:
    """The default world model (``model_id`` ``"world"``) with ``numerics`` ``"eager"`` or
    ``"compiled"``; ``prefer_prepared=False`` always loads the shipped weights."""
    return ChunkedWorldModel.load(default_world_model_dir(prefer_prepared), numerics=numerics, model_id=MODEL_NAME)


def load_default_maze_model(numerics: str = "eager") -> Any:  # MazeStateModel
    """The first-person maze's shipped model (``model_id`` ``"maze"``): the state model of one maze
    (``model/world/maze/state/``)."""
    if not (MAZE_SHIPPED_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(f"no shipped maze model weights in {MAZE_SHIPPED_DIR}; train one with "
                                "`python -m execstate_bench.world_tools.maze_state_train` from a source checkout")
    return load_world_dir(MAZE_SHIPPED_DIR, numerics=numerics, model_id=MAZE_NAME)


def load_default(name: str, numerics: str = "eager") -> Any:  # a WorldModel
    """The default model of world ``name`` (:data:`DEFAULT_WORLDS`)."""
    if name == MODEL_NAME:
        return load_default_world_model(numerics)
    if name == MAZE_NAME:
        return load_default_maze_model(numerics)
    raise ValueError(f"unknown world {name!r}; known: {list(DEFAULT_WORLDS)}")


def load_world_dir(path: Path | str, numerics: str = "eager", model_id: str | None = None) -> Any:  # a WorldModel
    """A trained world-model directory: the maze state model when its config has that model's
    fields (``maze_seed``), the maze pixel model when it has that one's (``strip``), else a grid
    model."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    if "maze_seed" in cfg:
        from execstate.model.world.maze.state.model import MazeStateModel

        return MazeStateModel.load(path, numerics=numerics, model_id=model_id or MAZE_NAME)
    if "strip" in cfg:
        from execstate.model.world.maze.model import MazeWorldModel

        return MazeWorldModel.load(path, numerics=numerics, model_id=model_id or MAZE_NAME)
    return ChunkedWorldModel.load(path, numerics=numerics, model_id=model_id or MODEL_NAME)
