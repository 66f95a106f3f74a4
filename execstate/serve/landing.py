"""The landing page at ``/``: what this server has loaded and where everything is.

One static HTML page, rendered once when the app is built (``install_landing``, called by
``serve/server.py`` after every surface is installed), from what the app holds: the served
language model (name, architecture, size, route return), the world model when ``/world`` is
served, the endpoints of each surface, and the docs. The docs site is linked at ``/docs/`` when it
was built next to the package (``make docs`` writes ``site/`` in a source checkout); otherwise the
page says how to build it. No script, no client input: nothing on it comes from a request.

The page and the docs site are public on a keyed server (``auth.py``: a browser cannot send a key
when it navigates), so there the page names no model: no name, path, architecture or context
length (what ``GET /v1/models`` tells a caller with a key), only the endpoints and the docs.
"""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from execstate.serve.auth import public_paths
from execstate.serve.context import ServeContext

DOCS_PATH = "/docs"


def docs_site_dir() -> Path | None:
    """The built docs site of a source checkout (``make docs``), if there is one."""
    site = Path(__file__).resolve().parents[2] / "site"
    return site if (site / "index.html").is_file() else None


def _lm_rows(app: FastAPI) -> list[tuple[str, str]]:
    ctx = getattr(app.state, "ctx", None)
    if ctx is None:
        return []
    engine, mc = ctx.engine, ctx.engine.model_config
    arch = f"{mc.architecture}, {mc.num_layers} layers, hidden {mc.hidden_size}"
    if mc.is_moe:
        arch += f", {mc.num_moe_layers} MoE layers of {mc.num_experts} experts (top-{mc.top_k})"
    return [("language model", f"{ctx.served_model_name} ({engine.model_path})"), ("architecture", arch),
            ("context length", str(engine.max_model_len)),
            ("routes returned (R3)", _routes(ctx))]


def _routes(ctx: ServeContext) -> str:
    if not ctx.engine.return_routes:
        return "no (start with --enable-return-routed-experts)"
    return "with every completion" if ctx.routes_by_default else 'to requests with "return_routed_experts": true'



def _world_rows(app: FastAPI) -> list[tuple[str, str]]:
    world = getattr(app.state, "world", None)
    if world is None:
        return []
    rows = []
    for name, host in world.host.hosts.items():
        spec = host.spec
        h, w, _ = spec.frame_shape
        camera = "; a camera (mouse)" if spec.camera is not None else ""
        rows.append(("world model", f"{name}: {w}x{h} frames, {spec.frames_per_chunk} per chunk, "
                     f"keys {', '.join(spec.keys[1:])}{camera}"))
    return rows


def _endpoints(app: FastAPI) -> list[tuple[str, str, str]]:
    """(path, what, link or '') for each served surface."""
    out: list[tuple[str, str, str]] = []
    if getattr(app.state, "world", None) is not None:
        out.append(("/world", "the world page: steer a world with the keys (and the mouse in the maze)", "/world"))
    if getattr(app.state, "voice", None) is not None:
        out.append(("/agent", "the voice agent page: talk to a duplex agent from the microphone", "/agent"))
    if getattr(app.state, "ctx", None) is not None:
        out += [("POST /v1/completions, /v1/chat/completions",
                 "the OpenAI-compatible API (SSE streaming, tools, structured outputs, echo and prompt logprobs)", ""),
                ("GET /v1/models", "the served model", "/v1/models"),
                ("POST /tokenize, /detokenize; GET /version", "the tokenizer and the server version, as vLLM's", "")]
    if getattr(app.state, "sessions", None) is not None:
        out.append(("/v1/sessions", "the HTTP session API and session migration", ""))
    if getattr(app.state, "realtime", None) is not None:
        out.append(("WS /v1/realtime", "sessions over a WebSocket (OpenAI Realtime-style events)", ""))
    if getattr(app.state, "agent", None) is not None:
        out.append(("WS /v1/realtime/agent", "full-duplex agents: delegation, barge-in, truncation", ""))
    if getattr(app.state, "voice", None) is not None:
        out.append(("WS /v1/voice/realtime", "voice agents over the OpenAI Realtime audio protocol", ""))
    if getattr(app.state, "world", None) is not None:
        out.append(("WS /v1/realtime/video", "world sessions: chunks of frames, key events, checkpoints", ""))
    out += [("GET /metrics", "Prometheus metrics", "/metrics"), ("GET /health", "liveness", "/health")]
    return out


def _keyed(app: FastAPI) -> bool:
    keys = getattr(app.state, "keys", None)
    return keys is not None and not keys.open


def render(app: FastAPI, docs: bool) -> str:
    # a public page on a keyed server: what is loaded is for callers with a key
    loaded = [KEYED_MODELS_ROW] if _keyed(app) else _lm_rows(app) + _world_rows(app)
    return page_html(loaded, _endpoints(app), docs)


# The "loaded" row of a public page on a server that asks for a key, in place of the model's rows.
KEYED_MODELS_ROW = ("models", "this server asks for an API key: GET /v1/models with 'Authorization: Bearer <key>' "
                    "lists them")


def page_html(loaded: list[tuple[str, str]], endpoints: list[tuple[str, str, str]], docs: bool) -> str:
    """The page: ``loaded`` (name, value) rows, ``endpoints`` (path, what, link or ''), the docs
    paragraph (``docs``: a site is served at ``/docs/``)."""
    e = html.escape
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in loaded)
    def cell(path: str, link: str) -> str:
        return f'<a href="{e(link)}">{e(path)}</a>' if link else e(path)

    eps = "".join(f"<tr><td><code>{cell(path, link)}</code></td><td>{e(what)}</td></tr>"
                  for path, what, link in endpoints)
    docs_html = (f'<p><a href="{DOCS_PATH}/">The documentation</a> (getting started, serving, sessions, world '
                 "models, agents, PD, performance, architecture, the command line).</p>" if docs else
                 "<p>The documentation is a MkDocs site in the repository's <code>docs/</code>: build it with "
                 "<code>make docs</code> in a source checkout and this server links it here.</p>")
    return _PAGE.format(rows=rows, endpoints=eps, docs=docs_html)


def install_landing(app: FastAPI, docs_dir: Path | None = None) -> None:
    """Serve the landing page at ``/`` (and the docs site at ``/docs/`` when ``docs_dir`` or a built
    site of the checkout exists). Call after every surface is installed."""
    docs_dir = docs_dir or docs_site_dir()
    public = public_paths(app)
    if docs_dir is not None:
        app.mount(DOCS_PATH, StaticFiles(directory=docs_dir, html=True), name="docs")
        public.add_prefix(DOCS_PATH)
    page = render(app, docs_dir is not None)
    public.add("/")

    @app.get("/", include_in_schema=False)
    async def landing() -> HTMLResponse:
        return HTMLResponse(page)



_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>execstate</title>
<style>
body {{ font: 15px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222 }}
table {{ border-collapse: collapse; margin: 0.5rem 0 1.5rem }}
th, td {{ text-align: left; padding: 0.25rem 1rem 0.25rem 0; vertical-align: top }}
th {{ font-weight: 600; white-space: nowrap }}
code {{ background: #f3f3f3; padding: 0 0.2rem }}
</style></head>
<body>
<h1>execstate</h1>
<p>An LLM inference runtime whose cache holds execution state: MoE RL rollouts with Rollout Routing
Replay, realtime world models and full-duplex agents, on one runtime.</p>
<h2>Loaded</h2>
<table>{rows}</table>
<h2>Endpoints</h2>
<table>{endpoints}</table>
<h2>Documentation</h2>
{docs}
</body></html>
"""
