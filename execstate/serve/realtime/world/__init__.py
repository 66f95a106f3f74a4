"""``/v1/realtime/video`` and the ``/world`` page: world-model sessions streamed as chunks.
``messages.py`` (client messages, phases, limits, error shape), ``handlers.py`` (one handler per
message), ``stepper.py`` (pacing the chunks), ``convert.py`` / ``encode.py`` (JSON and frames),
``host.py`` (``WorldHost``: the model and its sessions), ``endpoint.py`` (``install_world``, the
page), ``app.py`` (``execstate serve --world``)."""
