"""``execstate serve --world``: world sessions on a server (``endpoint.py``), with or without a
language model.

- ``execstate serve --world [MODEL]``: a world-only server: ``/v1/realtime/video``, the ``/world``
  page, ``/health``. ``MODEL`` is a trained world-model directory or ``world`` (the default: the
  trained model, prepared by ``execstate models prepare world`` or shipped in the package).
- ``execstate serve LM_MODEL --world [MODEL]``: the usual LM server (unchanged) plus the same
  world endpoints on the same app.

Options: ``--world-max-sessions`` (resident sessions; beyond: ``capacity``), ``--world-session-memory``
(each session's KV budget; beyond: ``memory_budget``), ``--world-fps`` (a session's default target
frame rate: 0, as fast as possible, or 1 to 240), ``--world-max-frames`` (the most frames a session
may ask for), ``--world-threads`` (torch threads).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from execstate.serve.auth import APIKeyMiddleware, public_paths
from execstate.serve.health import health_response
from execstate.serve.landing import install_landing
from execstate.serve.principals import KeyRing, keys_from_args
from execstate.serve.realtime.world.endpoint import install_world
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.hosts import WorldHosts
from execstate.session.runtime.manager import SessionPolicy
from execstate.state.quotas import Quotas


def world_model_from_option(name: str):  # noqa: ANN201 - a WorldModel (torch imported lazily)
    """The model one name of ``--world`` names: a trained world-model directory (grid or maze, by
    its config), ``world`` (the grid world's default model: the prepared one, else the weights
    shipped in the package) or ``maze`` (the first-person maze's shipped model;
    ``model/world_default.py``). (``session/world/offline.py``'s ``load_world_model`` is the offline
    API's: a model, a directory or ``None``, in a given numerics mode.)"""
    from execstate.model.world_default import DEFAULT_WORLDS, load_default, load_world_dir

    path = Path(name)
    if path.is_dir():
        return load_world_dir(path, model_id=name)
    if name not in DEFAULT_WORLDS:
        from execstate.model.errors import UnknownModelError

        raise UnknownModelError(f"--world {name!r} is not a world-model directory or one of {list(DEFAULT_WORLDS)}")
    return load_default(name)


def world_names(option: str) -> list[str]:
    """``--world``'s value: names separated by commas (``world,maze``), each once."""
    names = [n.strip() for n in option.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"--world {option!r}: give world names (or directories) separated by commas, each once")
    return names


def world_host_from_args(args: argparse.Namespace) -> WorldHosts:
    """One ``WorldHost`` per world ``--world`` names (the first: the default world)."""
    import torch

    if args.world_threads:
        torch.set_num_threads(args.world_threads)
    policy = SessionPolicy(max_checkpoints=getattr(args, "max_session_checkpoints", 64),
                           quotas=Quotas(world_sessions=getattr(args, "tenant_max_world_sessions", None)))
    return WorldHosts(WorldHost(world_model_from_option(name), model_name=name, max_sessions=args.world_max_sessions,
                                session_memory_bytes=args.world_session_memory, default_fps=args.world_fps,
                                max_frames=args.world_max_frames, policy=policy,
                                step_workers=getattr(args, "world_step_workers", 1))
                      for name in world_names(args.world))


def build_world_app(host: WorldHost | WorldHosts, api_key: str | None = None, keys: KeyRing | None = None) -> FastAPI:
    """A world-only app: ``/v1/realtime/video``, ``/world``, ``/health``; ``keys`` (or one ``api_key``)
    name each caller's tenant (``serve/auth.py``)."""
    app = FastAPI(title="execstate world", docs_url=None, redoc_url=None, openapi_url=None)
    keys = keys if keys is not None else KeyRing.build([api_key] if api_key else [])
    app.state.keys = keys
    app.add_middleware(APIKeyMiddleware, keys=keys, public=public_paths(app))
    install_world(app, host)

    @app.get("/health")
    async def health() -> JSONResponse:
        return health_response()  # the LM server's shape (serve/health.py)

    install_landing(app)
    return app


def world_startup_lines(hosts: WorldHosts, args: argparse.Namespace, seconds: float) -> list[tuple[str, str]]:
    """The start-up block of ``execstate serve --world`` (the LM server's format: ``startup_log.py``)."""
    import torch

    lines = []
    for name, h in hosts.hosts.items():
        spec = h.spec
        height, width, _ = spec.frame_shape
        where = name if Path(name).is_dir() else f"{name} (the default {spec.world} model)"
        camera = ", camera (yaw, pitch)" if spec.camera is not None else ""
        lines += [("world model", where), ("  weights version", spec.weights_version[:16]),
                  ("  frames", f"{width}x{height}, {spec.frames_per_chunk} per chunk, a window of at most "
                               f"{spec.max_window_chunks} chunks{camera}")]
    host = hosts.default
    return [
        *lines,
        ("device", f"cpu, {torch.get_num_threads()} threads"),
        ("world sessions", f"at most {host.max_sessions}, {host.session_memory_bytes / 2**20:.1f} MiB of K/V each, "
                           f"at most {host.max_frames} frames each"),
        ("default fps", f"{host.default_fps:g} (0: as fast as possible)"),
        ("endpoints", "/v1/realtime/video (WebSocket), /world (page), /health"),
        ("listening on", f"http://{args.host}:{args.port}"),
        ("API key", "required" if args.api_key else "off"),
        ("start-up", f"{seconds:.1f} s"),
    ]


def run_world_server(args: argparse.Namespace) -> int:
    import time

    import uvicorn

    from execstate.serve.realtime.limits import MAX_FRAME_BYTES
    from execstate.serve.startup_log import format_block, log

    t0 = time.perf_counter()
    keys = keys_from_args(args)
    host = world_host_from_args(args)
    try:
        app = build_world_app(host, keys=keys)
        log.info("%s", format_block(world_startup_lines(host, args, time.perf_counter() - t0),
                                    "execstate serve --world ready"))
        uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                      ws_max_size=MAX_FRAME_BYTES)).run()
        return 0
    finally:
        host.shutdown()
