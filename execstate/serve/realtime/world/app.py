"""``execstate serve --world``: world sessions on a server (``endpoint.py``), with or without a
language model.

- ``execstate serve --world [MODEL]``: a world-only server: ``/v1/realtime/video``, the ``/world``
  page, ``/health``. ``MODEL`` is a trained world-model directory or ``world`` (the default: the
  trained model, prepared by ``execstate models prepare world`` or shipped in the package).
- ``execstate serve LM_MODEL --world [MODEL]``: the usual LM server (unchanged) plus the same
  world endpoints on the same app.

Options: ``--world-max-sessions`` (resident sessions; beyond: ``capacity``), ``--world-session-memory``
(each session's KV budget; beyond: ``memory_budget``), ``--world-fps`` (a session's default target
frame rate; 0: as fast as possible), ``--world-threads`` (torch threads).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from execstate.serve.auth import APIKeyMiddleware
from execstate.serve.landing import install_landing
from execstate.serve.realtime.world.endpoint import install_world
from execstate.serve.realtime.world.host import WorldHost


def world_model_from_option(name: str):  # noqa: ANN201 - ChunkedWorldModel (torch imported lazily)
    """The model ``--world NAME`` names: a trained world-model directory, or ``world``: the default
    model (the prepared one, else the weights shipped in the package: ``model/world/default.py``).
    (``session/world_offline.py``'s ``load_world_model`` is the offline API's: a model, a directory
    or ``None``, in a given numerics mode.)"""
    from execstate.model.world.default import load_default_world_model
    from execstate.model.world.model import ChunkedWorldModel

    path = Path(name)
    if path.is_dir():
        return ChunkedWorldModel.load(path, model_id=name)
    if name != "world":
        raise ValueError(f"--world {name!r} is not a world-model directory or 'world'")
    return load_default_world_model()


def world_host_from_args(args: argparse.Namespace) -> WorldHost:
    import torch

    if args.world_threads:
        torch.set_num_threads(args.world_threads)
    return WorldHost(world_model_from_option(args.world), model_name=args.world, max_sessions=args.world_max_sessions,
                     session_memory_bytes=args.world_session_memory, default_fps=args.world_fps)


def build_world_app(host: WorldHost, api_key: str | None = None) -> FastAPI:
    """A world-only app: ``/v1/realtime/video``, ``/world``, ``/health``."""
    app = FastAPI(title="execstate world", docs_url=None, redoc_url=None, openapi_url=None)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    install_world(app, host)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "world_sessions": host.num_sessions})

    install_landing(app)
    return app


def run_world_server(args: argparse.Namespace) -> int:
    import uvicorn

    host = world_host_from_args(args)
    try:
        app = build_world_app(host, args.api_key)
        uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info")).run()
        return 0
    finally:
        host.shutdown()
