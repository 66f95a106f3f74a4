"""``/v1/realtime/video`` (world sessions) and the ``/world`` browser page.

The socket loop, the limits (``messages.py``) and the error handling are the framework's
(``serve/realtime/``): JSON events go out as text frames, each chunk as its
``video.chunk_metadata`` text frame immediately followed by its binary frame. This module holds what
the app's connections share: the ``WorldHosts`` (per world: the model and the sessions' runtime). When a socket
goes, the message being handled is finished, the rest dropped, and the session is released
(``WorldHandlers.close``): its KV blocks go back, its place among the resident sessions is free.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from execstate.serve.auth import public_paths
from execstate.serve.key_script import install_key_script
from execstate.serve.realtime.connection import Peer
from execstate.serve.realtime.endpoint import Endpoint, mount
from execstate.serve.realtime.world.handlers import WorldHandlers
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.hosts import WorldHosts, as_hosts
from execstate.serve.realtime.world.messages import WORLD_PROTOCOL

PATH = "/v1/realtime/video"
PAGE_PATH = "/world"


class WorldServer:
    """The world endpoint of one app: the worlds it serves (``host``: a ``WorldHosts``, one
    ``WorldHost`` per world) and the endpoint (``num_connections``)."""

    def __init__(self, hosts: WorldHost | WorldHosts) -> None:
        self.host = as_hosts(hosts)
        self.endpoint = Endpoint(WORLD_PROTOCOL, self.handlers)

    def handlers(self, peer: Peer) -> WorldHandlers:
        """The handlers of one new connection."""
        return WorldHandlers(peer, self.host)

    @property
    def num_connections(self) -> int:
        return self.endpoint.num_connections


def page_html() -> str:
    return resources.files("execstate.serve").joinpath("static/world.html").read_text()


def install_world(app: FastAPI, hosts: WorldHost | WorldHosts) -> WorldServer:
    """Serve ``/v1/realtime/video`` and ``/world`` (+ ``/world.js``) for these worlds on ``app``
    (``app.state.world``)."""
    server = WorldServer(hosts)
    app.state.world = server
    mount(app, PATH, server.endpoint)
    html = page_html()
    script = resources.files("execstate.serve").joinpath("static/world.js").read_text()

    @app.get(PAGE_PATH, include_in_schema=False)
    async def world_page() -> HTMLResponse:
        return HTMLResponse(html)

    @app.get(PAGE_PATH + ".js", include_in_schema=False)
    async def world_script() -> Response:
        return Response(script, media_type="text/javascript")

    public_paths(app).add(PAGE_PATH, PAGE_PATH + ".js")  # the page asks for the key (key_script.py)
    install_key_script(app)
    return server
