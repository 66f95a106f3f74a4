"""Back-end tasks: tools (Python callables) and model sessions, each on its own timescale.

``Backend.start(delegation, done)`` runs one task as an asyncio task and calls
``done(delegation_id, result, error)`` on the agent's event loop when it ends (``result`` is the
tool's return value as text; ``error`` the exception's text). A sync callable runs in a worker
thread (``executor``, else asyncio's default; so a slow tool never blocks the front); an ``async
def`` is awaited. ``cancel(id)`` cancels the task (``done`` is not called then).

Bounds (``TaskLimits``): a task still running after ``timeout_s`` is cancelled and ends with the
error ``timeout: ...`` (a sync tool's thread cannot be stopped: it runs on, its result dropped,
which is why the server gives its tools their own small pool of threads); at most ``max_tasks``
run at once (``full``: the agent refuses a delegation beyond it, ``too_many_tasks``). A :class:`ModelTool` is a
slower model: each task opens
its own LM session on its ``AsyncEngine`` (batch class by default, below the front), runs one step
on the prompt and closes it; ``sessions`` is the engine's ``AsyncSessions`` when something else on
that engine opens sessions too (an engine has one: pass the shared one), else it builds its own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from execstate.agent.agent_events import DelegationId
from execstate.agent.ledger import Delegation
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.priority import PRIORITY_BATCH
from execstate.engine.sampling_params import SamplingParams
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.step import StepResult

Done = Callable[[DelegationId, str | None, str | None], None]
DEFAULT_TOOL_TIMEOUT_S = 60.0
DEFAULT_MAX_TASKS = 8


@dataclass(frozen=True)
class TaskLimits:
    """One agent's back-end bounds: a task's time (``timeout_s``) and the tasks running at once."""

    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    max_tasks: int = DEFAULT_MAX_TASKS

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"a tool timeout is a finite number of seconds > 0, got {self.timeout_s!r}")
        if isinstance(self.max_tasks, bool) or not isinstance(self.max_tasks, int) or self.max_tasks < 1:
            raise ValueError(f"max_tasks must be an integer >= 1, got {self.max_tasks!r}")


class ModelTool:
    """A back-end model: ``await tool(prompt=...)`` -> its completion (one session per call)."""

    def __init__(self, engine: AsyncEngine, max_tokens: int = 32, priority: int = PRIORITY_BATCH,
                 sampling_params: SamplingParams | None = None, prompt_format: str = "{prompt}",
                 sessions: AsyncSessions | None = None) -> None:
        self.sessions = sessions or AsyncSessions(engine)
        self.max_tokens = max_tokens
        self.priority = priority
        self.params = sampling_params or SamplingParams(temperature=0.0, max_tokens=max_tokens)
        self.prompt_format = prompt_format

    async def __call__(self, prompt: str) -> str:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("a model task needs a non-empty 'prompt' string")
        info = await self.sessions.open(None, self.params, priority=self.priority)
        try:
            text = ""
            async for item in self.sessions.step(info.session_id, self.prompt_format.format(prompt=prompt),
                                                 max_tokens=self.max_tokens):
                if isinstance(item, StepResult):
                    text = item.text or ""
            return text.strip()
        finally:
            await self.sessions.close(info.session_id)


class Backend:
    def __init__(self, tools: Mapping[str, Callable[..., Any]] | None = None, limits: TaskLimits | None = None,
                 executor: Executor | None = None) -> None:
        self.tools = dict(tools or {})
        self.limits = limits or TaskLimits()
        self.executor = executor
        for name, fn in self.tools.items():
            if not isinstance(name, str) or not name or not callable(fn):
                raise ValueError(f"tool {name!r}: a non-empty name and a callable")
        self._tasks: dict[DelegationId, asyncio.Task[None]] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self.tools)

    @property
    def running(self) -> list[DelegationId]:
        return [k for k, t in self._tasks.items() if not t.done()]

    @property
    def full(self) -> bool:
        """``limits.max_tasks`` tasks are running: a new one would be beyond the bound."""
        return len(self.running) >= self.limits.max_tasks

    def start(self, d: Delegation, done: Done) -> None:
        """Run ``d``'s tool as a task (module docstring); ``RuntimeError`` when ``full`` (check first)."""
        if self.full:
            raise RuntimeError(f"{self.limits.max_tasks} back-end tasks are already running")
        fn = self.tools[d.tool]
        timeout_s = self.limits.timeout_s

        async def run() -> None:
            try:
                async with asyncio.timeout(timeout_s) as deadline:
                    if _is_async(fn):
                        out = await fn(**d.arguments)
                    else:
                        call = functools.partial(fn, **d.arguments)
                        out = await asyncio.get_running_loop().run_in_executor(self.executor, call)
            except asyncio.CancelledError:
                raise
            except TimeoutError as exc:
                why = f"timeout: the tool ran longer than {timeout_s:g} s" if deadline.expired() else (
                    f"{type(exc).__name__}: {exc}")
                done(d.delegation_id, None, why)
            except Exception as exc:  # a task's failure is its result, never the agent's
                done(d.delegation_id, None, f"{type(exc).__name__}: {exc}")
            else:
                done(d.delegation_id, str(out), None)
            finally:
                self._tasks.pop(d.delegation_id, None)

        self._tasks[d.delegation_id] = asyncio.get_running_loop().create_task(run(), name=f"backend:{d.delegation_id}")

    def cancel(self, delegation_id: DelegationId) -> bool:
        task = self._tasks.pop(delegation_id, None)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    async def close(self, cancel: bool = True) -> None:
        """Cancel every task (``cancel``) or wait for them to finish."""
        tasks = list(self._tasks.values())
        if cancel:
            for t in tasks:
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()


def _is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one (``ModelTool``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
