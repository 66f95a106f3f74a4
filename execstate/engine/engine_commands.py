"""The commands other threads send to ``AsyncEngine``'s engine thread (a FIFO queue drained
between steps), and where a request's outputs go (``_Sink``: an asyncio queue on the
consumer's loop, filled with ``call_soon_threadsafe``). Plain data; the engine thread's
handling of each is ``AsyncEngine._handle``."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from execstate.engine.outputs import RequestOutput
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.weight_update import UpdatePolicy, WeightUpdateResult
from execstate.transfer.handoff import Handoff

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine, PromptType


class EngineDeadError(RuntimeError):
    """The engine thread is gone (crashed or shut down); no request can be served."""


@dataclass
class _Sink:
    """Where a request's outputs go: an asyncio queue on the consumer's loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | EngineDeadError]

    def put(self, item: RequestOutput | EngineDeadError) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class _Add:
    prompt: PromptType
    params: SamplingParams
    request_id: str
    kv_transfer_params: dict[str, Any] | Handoff | None
    sink: _Sink
    done: concurrent.futures.Future[None]


@dataclass
class _AddWith:
    start: Callable[[LLMEngine], str]
    sink: _Sink
    done: concurrent.futures.Future[str]


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    done: concurrent.futures.Future[Any]


@dataclass
class _UpdateWeights:
    state_dict: dict[str, torch.Tensor]
    weights_version: str | None
    policy: UpdatePolicy
    done: concurrent.futures.Future[WeightUpdateResult]


class _Stop:
    pass


def _copy(err: EngineDeadError) -> EngineDeadError:
    """A fresh instance per raise: one exception object must not travel through many tasks."""
    new = EngineDeadError(str(err))
    new.__cause__ = err.__cause__
    return new


_Command = _Add | _AddWith | _Abort | _Call | _UpdateWeights | _Stop
