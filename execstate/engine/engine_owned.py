"""State a layer above keeps on the engine thread, and the one typed way to reach it.

``AsyncEngine.own(build, close)`` returns an :class:`EngineOwned`: an object built on the engine
thread by ``build(engine)`` at its first use, then handed (never the engine) to every function
run through it. The session layer keeps its sessions this way (``session/lm/async_sessions.py``:
the engine's ``LMSessions``), so no closure above the engine receives the engine itself.

Contract:

- ``build`` runs once, on the engine thread, at the first ``run`` / ``call`` / ``stream`` / ``get``;
  an exception from it is raised to that caller and the next use tries again.
- ``run(fn)`` (event loop) and ``call(fn, timeout)`` (plain threads; on the engine thread itself
  it runs ``fn`` directly) run ``fn(owned)`` on the engine thread between two steps and return
  its result; an exception from ``fn`` is raised to the caller and does not hurt the engine.
- ``stream(start)``: ``start(owned)`` adds one request and returns its id; its outputs are
  yielded as ``AsyncEngine.stream`` yields them.
- ``get(engine)``: the owned object, on the engine thread only (inside an engine-thread hook).
- At the engine's shutdown, after the requests in flight were aborted, ``close(owned)`` runs on
  the engine thread if the object was built.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from execstate.engine.outputs import RequestOutput

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine

O = TypeVar("O")  # noqa: E741 - the owned object's type
T = TypeVar("T")


class EngineFront(Protocol):
    """What an :class:`EngineOwned` needs of its engine's front (``AsyncEngine`` is one)."""

    async def run_on_engine(self, fn: Callable[[LLMEngine], T]) -> T: ...

    def call(self, fn: Callable[[LLMEngine], T], timeout: float | None = None) -> T: ...

    def stream(self, start: Callable[[LLMEngine], str]) -> AsyncGenerator[RequestOutput, None]: ...

    def add_shutdown_hook(self, fn: Callable[[LLMEngine], None]) -> None: ...


class EngineOwned(Generic[O]):
    def __init__(self, engine: EngineFront, build: Callable[[LLMEngine], O],
                 close: Callable[[O], None] | None = None) -> None:
        self._engine = engine
        self._build = build
        self._close = close
        self._owned: O | None = None
        engine.add_shutdown_hook(self._shutdown)

    def get(self, engine: LLMEngine) -> O:
        """Engine thread only: the owned object (built by the first use)."""
        if self._owned is None:
            self._owned = self._build(engine)
        return self._owned

    async def run(self, fn: Callable[[O], T]) -> T:
        """``fn(owned)`` on the engine thread, between two engine steps."""
        return await self._engine.run_on_engine(lambda engine: fn(self.get(engine)))

    def call(self, fn: Callable[[O], T], timeout: float | None = None) -> T:
        """Blocking :meth:`run` for plain threads; never on the event loop."""
        return self._engine.call(lambda engine: fn(self.get(engine)), timeout)

    def stream(self, start: Callable[[O], str]) -> AsyncGenerator[RequestOutput, None]:
        """``AsyncEngine.stream`` with ``start(owned)``: the request it adds, output by output."""
        return self._engine.stream(lambda engine: start(self.get(engine)))

    def _shutdown(self, engine: LLMEngine) -> None:
        if self._owned is not None and self._close is not None:
            self._close(self._owned)
