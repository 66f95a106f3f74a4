"""The offline world-model API (``execstate.World``), one call per operation::

    world = World()                                    # the default trained model, eager
    s = world.open_session(prompt="a meadow maze", seed=0, scene_seed=3)   # start from a scene
    r = s.step()                                       # one chunk -> WorldStepResult (r.frames uint8 [F,H,W,3])
    s.submit_event(1, "key", {"key": "left", "down": True})   # held from the next chunk on
    r = s.step(action="up")                            # this chunk only
    cp = s.checkpoint(); s.rollback(cp); f = s.fork(cp)
    s.hibernate(); s.wake()                            # state to a tier, K/V blocks released; any call wakes it
    s.reset(); s.close(); world.close()

Steps run on the caller's thread. Rules of the status machine, checkpoints and forks:
``session/runtime/lifecycle.py``; events: ``session/runtime/events.py`` and ``session/world/events.py``; sizes,
budgets and errors: ``session/world/sessions.py``. A ``WorldSession`` and a ``World`` are
context managers that close them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from execstate.identity.secret_ring import SecretRing
from execstate.model.world.interface import WorldModel, WorldSpec
from execstate.session.runtime.checkpoint import Checkpoint
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.handle import SessionHandle
from execstate.session.runtime.manager import SessionPolicy
from execstate.session.world.hibernation import hibernate, wake
from execstate.session.world.sessions import WorldSessionInfo, WorldSessions
from execstate.session.world.step import WorldStepResult
from execstate.state.tiers.store import UnitStore

__all__ = ["Checkpoint", "SessionEventError", "World", "WorldSession", "WorldStepResult", "scene_frames"]


def load_world_model(model: WorldModel | str | Path | None, numerics: str = "eager") -> WorldModel:
    """``None``: the default trained model (the grid world's); ``"world"`` or ``"maze"``: that world's
    default model; a directory: a trained model there (either kind); a model: as is (its own
    numerics mode must then equal ``numerics``)."""
    from execstate.model.world_default import DEFAULT_WORLDS, load_default, load_world_dir

    if model is None:
        return load_default("world", numerics)
    if isinstance(model, str) and model in DEFAULT_WORLDS and not Path(model).is_dir():
        return load_default(model, numerics)
    if isinstance(model, str | Path):
        if not Path(model).is_dir():
            raise ValueError(f"world model {str(model)!r} is not a directory (or one of {list(DEFAULT_WORLDS)})")
        return load_world_dir(model, numerics)
    if not isinstance(model, WorldModel):
        raise ValueError(f"model must be a WorldModel, a directory or None, got {type(model).__name__}")
    if model.spec.numerics != numerics:
        raise ValueError(f"the model runs {model.spec.numerics!r} numerics, but numerics={numerics!r} was asked")
    return model


def scene_frames(spec: WorldSpec, scene_seed: int, prompt: str = "") -> np.ndarray:
    """The first chunk of scene ``scene_seed`` of the procedural world the model was trained on
    (``WorldSpec.world``, ``model/world/scenes.py``; the theme from the prompt's words):
    uint8 ``[F, H, W, 3]``. A model that knows only some scenes (``WorldSpec.scenes``) is refused
    the others."""
    from execstate.model.world.scenes import scene_frames as render_scene

    if spec.scenes is not None and scene_seed not in spec.scenes:
        raise SessionEventError("invalid", f"model {spec.model_id!r} knows the scenes {list(spec.scenes)} of the "
                                f"{spec.world} world, not scene {scene_seed}")
    try:
        frames = render_scene(spec.world, scene_seed, prompt, spec.frames_per_chunk)
    except ValueError as e:
        raise SessionEventError("invalid", str(e)) from None
    if tuple(frames.shape[1:]) != spec.frame_shape:
        raise SessionEventError("invalid", f"the procedural world renders {frames.shape[1:]} frames, the model "
                                f"makes {spec.frame_shape}: pass start_frames instead of scene_seed")
    return frames


def known_scene(spec: WorldSpec, seed: int) -> int:
    """``seed`` if the model knows that scene (every scene, for a model with no ``WorldSpec.scenes``),
    else one of those it knows (``scenes[seed % len(scenes)]``): how the server's ``seed`` and the
    benchmarks pick a scene that any model can start from."""
    if spec.scenes is None or seed in spec.scenes:
        return seed
    return spec.scenes[seed % len(spec.scenes)]


class World:
    def __init__(self, model: WorldModel | str | Path | None = None, numerics: str = "eager", max_sessions: int = 8,
                 session_blocks: int | None = None, num_blocks: int | None = None, eviction: str | None = None,
                 max_session_events: int = 64, block_size: int | None = None,
                 policy: SessionPolicy | None = None, hibernate_to: UnitStore | None = None,
                 hibernate_secret: SecretRing | None = None) -> None:
        """``policy``: a server's bounds on its sessions (``session/runtime/manager.py``);
        ``hibernate_to`` / ``hibernate_secret``: where hibernated sessions sleep and what signs them
        (``session/world/sessions.py``)."""
        self.model = load_world_model(model, numerics)
        self.sessions = WorldSessions(self.model, max_sessions, session_blocks, num_blocks, eviction,
                                      max_session_events, block_size, policy, hibernate_to, hibernate_secret)

    @property
    def spec(self) -> WorldSpec:
        return self.model.spec

    def open_session(self, prompt: str = "", seed: int = 0, start_frames: np.ndarray | None = None,
                     scene_seed: int | None = None, window_chunks: int | None = None, sink_chunks: int | None = None,
                     session_id: str | None = None) -> WorldSession:
        """A new session; ``seed`` seeds its noise. It starts from ``start_frames`` (uint8
        ``[F, H, W, 3]``, committed as chunk 0), from the procedural scene ``scene_seed``, or, with
        neither, from nothing (its first step generates from the prompt)."""
        if scene_seed is not None:
            if start_frames is not None:
                raise SessionEventError("invalid", "give start_frames or scene_seed, not both")
            start_frames = scene_frames(self.spec, scene_seed, prompt)
        rt = self.sessions.open(session_id, prompt, seed, start_frames, window_chunks, sink_chunks)
        return WorldSession(self.sessions, rt)

    def session(self, session_id: str) -> WorldSession:
        return WorldSession(self.sessions, self.sessions.runtime(session_id))

    def list_sessions(self) -> list[WorldSessionInfo]:
        return self.sessions.list()

    def close(self) -> None:
        self.sessions.close_all()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorldSession(SessionHandle):
    """A world-model session (``World.open_session``): the shared handle
    (``session/runtime/handle.py``) plus ``step`` (one chunk), ``next_event_id`` and ``migrate``."""

    _sessions: WorldSessions

    def info(self) -> WorldSessionInfo:
        return self._sessions.info(self.session_id, self.access)

    def next_event_id(self) -> int:
        return self._rt.next_event_id()

    def step(self, action: str | list[str] | None = None) -> WorldStepResult:
        return self._sessions.step(self.session_id, action, self.access)

    def hibernate(self) -> WorldSessionInfo:
        """Sleep: the session's state goes to the World's hibernation tier as one signed unit and
        its K/V blocks go back to the pool (``session/world/hibernation.py``). The next call wakes it."""
        hibernate(self._sessions, self.session_id, self.access)
        return self.info()

    def wake(self) -> WorldSessionInfo:
        """Wake now (any other call would too); raises the check that failed, if one did."""
        wake(self._sessions, self.session_id, self.access)
        return self.info()

    def migrate(self, target: World, secret: SecretRing | None = None) -> WorldSession:
        """Move this session to World ``target`` (``session/world/migration.py``) and return its
        handle there (same id); this one is closed. ``MigrationError`` leaves it serving here."""
        from execstate.session.world.migration import migrate_world_session

        return WorldSession(target.sessions, migrate_world_session(self._sessions, self.session_id, target.sessions,
                                                                   secret))
