"""``/v1/realtime/agent``: full-duplex agents over a WebSocket. ``messages.py`` (client messages,
phases, error codes), ``handlers.py`` (one handler per message, the event pump), ``convert.py``
(settings and agent events <-> JSON), ``tools.py`` (the server's tools), ``endpoint.py``
(``install_agent``, the task keeper)."""
