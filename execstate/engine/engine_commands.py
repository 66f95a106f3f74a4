"""The commands other threads send to ``AsyncEngine``'s engine thread (a FIFO queue drained
between steps), and where a request's outputs go (``OutputSink``: an asyncio queue on the
consumer's loop, filled with ``call_soon_threadsafe``). Plain data; the engine thread's
handling of each is in ``engine/engine_thread.py``."""

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
from execstate.identity.scope import CacheScope
from execstate.transfer.handoff import Handoff

if TYPE_CHECKING:
    from execstate.engine.llm_engine import LLMEngine, PromptType


class EngineDeadError(RuntimeError):
    """The engine thread is gone (crashed or shut down); no request can be served."""


@dataclass
class OutputSink:
    """Where a request's outputs go: an asyncio queue on the consumer's loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | EngineDeadError]

    def put(self, item: RequestOutput | EngineDeadError) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass
class AddCommand:
    prompt: PromptType
    params: SamplingParams
    request_id: str
    kv_transfer_params: dict[str, Any] | Handoff | None
    scope: CacheScope | None
    sink: OutputSink
    done: concurrent.futures.Future[None]


@dataclass
class AddWithCommand:
    start: Callable[[LLMEngine], str]
    sink: OutputSink
    done: concurrent.futures.Future[str]


@dataclass
class AbortCommand:
    request_id: str


@dataclass
class CallCommand:
    fn: Callable[[LLMEngine], Any]
    done: concurrent.futures.Future[Any]


@dataclass
class UpdateWeightsCommand:
    state_dict: dict[str, torch.Tensor]
    weights_version: str | None
    policy: UpdatePolicy
    done: concurrent.futures.Future[WeightUpdateResult]


class StopCommand:
    pass


def copy_dead_error(err: EngineDeadError) -> EngineDeadError:
    """A fresh instance per raise: one exception object must not travel through many tasks."""
    new = EngineDeadError(str(err))
    new.__cause__ = err.__cause__
    return new


Command = AddCommand | AddWithCommand | AbortCommand | CallCommand | UpdateWeightsCommand | StopCommand
