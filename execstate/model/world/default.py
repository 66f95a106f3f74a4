"""The default world model: where its weights come from, and loading it.

Two sources, in this order:

1. the prepared model in the cache (``execstate models prepare world``: the default recipe trained
   on this machine into ``paths.model_dir("world")``), when :func:`registry.is_prepared` says it is
   complete and matches the current recipe;
2. the weights shipped in the package (``execstate/model/world/shipped/``: the same recipe,
   trained once by ``execstate models prepare world`` and stored in bf16, a few MB), so that tests,
   CI, the runtime and the browser page work on a fresh clone without training.

``weights_version`` of the loaded model is the sha256 of the weights file it was loaded from
(the two sources differ, so they never share cached state). The loaded network computes in fp32
whatever the storage dtype.
"""

from __future__ import annotations

from pathlib import Path

from execstate.model.world.model import ChunkedWorldModel

SHIPPED_DIR = Path(__file__).parent / "shipped"
MODEL_NAME = "world"


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
