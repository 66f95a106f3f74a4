"""The OpenAI-compatible HTTP API: ``/v1/completions`` (``completions.py``), ``/v1/chat/completions``
(``chat.py``), their shared request pipeline (``pipeline.py``, ``generation.py``, ``convert.py``,
``limit_checks.py``), the request and response models (``protocol.py``) and SSE (``streaming.py``).
The app that mounts them is ``serve/app.py``."""
