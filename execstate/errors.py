"""The one error type of a refused call: :class:`CodedError` (a ``code`` and a ``message``).

Every layer that refuses a call with a machine-readable reason raises a ``CodedError`` (or a
subclass that names its domain: ``SessionEventError``, ``MigrationError``, ``HandoverError``,
``AgentError``, ``LedgerError``). ``code`` is a short snake_case word the clients see unchanged
(``busy``, ``not_found``, ``replay``...); ``message`` names the problem for a person; ``str(err)``
is ``"<code>: <message>"``, so a log line or a traceback names both.

How a code reaches a client is the surface's business, decided once per surface: the HTTP status
of every code is the one table in ``serve/errors.py`` (HTTP exists only in ``serve/``); the
realtime sockets answer an ``error`` event with the code as is (``serve/realtime/errors.py``).
Pure Python: nothing here imports anything of execstate, so every layer may import it.
"""

from __future__ import annotations


class CodedError(Exception):
    """A refused call: ``code`` (what clients match on) and ``message`` (what a person reads)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
