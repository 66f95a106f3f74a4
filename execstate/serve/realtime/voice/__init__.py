"""``/v1/voice/realtime``: the OpenAI Realtime audio protocol over a voice agent (``messages.py``, ``handlers.py``)."""
