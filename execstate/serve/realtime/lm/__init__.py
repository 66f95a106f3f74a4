"""``/v1/realtime``: LM sessions over a WebSocket. ``messages.py`` (client messages, phases),
``handlers.py`` (one handler per message), ``convert.py`` (JSON <-> session values), ``owners.py``
(which connection holds which session; the grace period), ``endpoint.py`` (``install_realtime``)."""
