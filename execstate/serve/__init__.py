"""Serving, by surface.

==================  ===============================================================================
``openai/``         the OpenAI-compatible HTTP API: completions, chat, their request pipeline
``sessions/``       the HTTP session API (``/v1/sessions``) and session migration between servers
``realtime/``       the realtime WebSocket framework, and its protocols: ``lm/`` (``/v1/realtime``),
                    ``world/`` (``/v1/realtime/video`` and the ``/world`` page), ``agent/``
                    (``/v1/realtime/agent``)
``pd/``             prefill/decode disaggregation: the proxy in front of P and D servers
==================  ===============================================================================

Shared by the surfaces: ``app.py`` (``build_app``: one app with every surface), ``server.py``
(``execstate serve``: the engine, the PD connector, uvicorn), ``context.py`` (what every endpoint
shares), ``auth.py`` (the API key, HTTP and WebSocket), ``errors.py`` (OpenAI error bodies),
``limits.py`` and ``body_limit.py`` (request bounds), ``metrics.py`` (``/metrics``),
``route_rows.py`` (R3 route rows on the wire), ``kv_transfer_config.py`` (``--kv-transfer-config``,
the engine's PD connector settings), ``startup_log.py``; ``static/`` holds the page.
The surfaces import only these shared modules, never each other (``lint-imports``). The other
modules at this level are deprecated shims of former paths.
"""
