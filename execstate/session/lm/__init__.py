"""The LM session kind: a long-lived token context on an ``LLMEngine`` (docs/contracts.md 6).

- ``events.py`` (its event kinds: ``input``, ``sampling``), ``state.py`` (its ``KindState``:
  tokens, KV blocks, routes, RNG), ``step.py`` (a step as an engine request);
- ``sessions.py``: ``LMSessions``, the engine's sessions (engine thread only);
- ``offline.py`` (``Session``), ``llm.py`` (``execstate.LLM``: the engine's ``LLM`` plus its
  sessions) and ``async_sessions.py`` (``AsyncSessions``, for an asyncio server);
- ``migration*.py``: moving a session between engines (its KV through the PD connectors).
"""
