"""HTTP serving: OpenAI-compatible API, metrics, and the PD connector hook (``server.py``)."""
