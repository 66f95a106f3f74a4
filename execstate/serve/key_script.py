"""``GET /api-key.js``: how the browser pages (``/world``, ``/agent``) get the API key of a keyed server.

A browser cannot send a key when it navigates to a page, nor set a header on a WebSocket, so the
pages are public (``auth.py``) and this script offers the key as the WebSocket subprotocol
``openai-insecure-api-key.<key>``: taken from ``?key=`` (then removed from the address bar) or the
tab's ``sessionStorage``, and asked for when the server refuses the socket for want of one (a
``GET /v1/models`` answering 401 tells a refusal from a server that is down). The script itself is
public and reveals nothing. ``static/api-key.js`` is the script; ``install_key_script`` serves it
once per app, whichever page installs it first.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from execstate.serve.auth import public_paths

SCRIPT_PATH = "/api-key.js"


def install_key_script(app: FastAPI) -> None:
    """Serve ``/api-key.js`` on ``app`` (public) unless a page already did."""
    if any(getattr(r, "path", None) == SCRIPT_PATH for r in app.routes):
        return
    script = resources.files("execstate.serve").joinpath("static/api-key.js").read_text()

    @app.get(SCRIPT_PATH, include_in_schema=False)
    async def api_key_script() -> Response:
        return Response(script, media_type="text/javascript")

    public_paths(app).add(SCRIPT_PATH)
