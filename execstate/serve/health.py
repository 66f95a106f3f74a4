"""``GET /health``: one shape whatever the server serves (an LM, world sessions, both, the PD proxy).

200 ``{"status": "ok"}`` while it serves; 503 ``{"status": "unhealthy", "error": "<why>"}`` once
it cannot (the LM's engine thread died). Open without the API key, as in vLLM. Counts (sessions,
connections) belong to ``/metrics``, not here.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


def health_response(error: str | None = None) -> JSONResponse:
    if error is None:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "unhealthy", "error": error}, status_code=503)
