"""The front: the fast model an agent speaks with, stepped a few tokens at a time.

:class:`FrontModel` is what ``DuplexAgent`` needs from it (any modality: an audio front would
implement the same calls over its own session kind). Contract:

- ``step(input_ids, max_tokens)`` appends ``input_ids`` to the context at this step boundary and
  generates at most ``max_tokens`` tokens, yielding :class:`FrontChunk`s and, last, one
  :class:`FrontStepEnd`. One step at a time; the caller always consumes it to its end.
- ``cancel()`` makes the step in flight end early (``finish_reason == "abort"``); the context
  keeps what it generated until then (the caller rolls back what it must not keep).
- ``prelude()`` is what the context starts with (a system prompt, with the tokenizer's special
  tokens); the agent appends it at its first step and keeps it in its transcript.
- ``mark()`` checkpoints the context at a boundary (no step in flight); ``rewind(mark)`` rolls
  back to it (the mark stays valid); ``truncate(mark, keep)`` rolls back to it keeping the next
  ``keep`` tokens the context holds after it (the mark on the context's branch; their KV is
  kept, as after a step that sent them); ``release(mark)`` drops it.
- ``speculate(input_ids, end_tokens, then)`` is a step of one token used for its distribution:
  it appends ``input_ids`` (their KV is computed) and returns :class:`Speculation`: the
  probability that one of ``end_tokens`` comes next (the model's own distribution) and how many
  tokens the step computed and found cached, and the model's final hidden state at the input's
  last token when the front returns it (``hidden``, None otherwise: the end-of-turn probe,
  ``agent/end_probe.py``, reads it). The token it appends is ``then`` (whatever the
  distribution), so the context is ``input_ids + [then]``: the caller rewinds, or keeps it when
  its next input would have started that way.
  ``FrontStepEnd.computed`` (when known) is what a step ran through the model.

:class:`SessionFront` implements it with an LM session on an ``AsyncEngine``
(``session/lm/async_sessions.py``): each step is a session step, so it runs in the session's
priority class (interactive by default: above batch and back-end requests in the same engine).
Its session asks for the top ``SCORE_LOGPROBS`` logprobs of each token (``speculate`` reads the
end tokens' among them; absent: probability 0; logprobs are the raw distribution's) and the
final hidden state where a step samples its first token (``return_hidden``: a speculation's
``hidden``); ``weights_version`` is the engine's (the probe is for one model's weights). A
speculation makes ``then`` the sampled token with a ``logit_bias`` (a ``sampling`` event of its
step); the next ``step`` puts the session's own bias back first, unless a ``rewind`` (which
restores the session's sampling parameters) came in between.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.priority import PRIORITY_INTERACTIVE
from execstate.engine.sampling_params import SamplingParams
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.lm.step import StepDelta, StepResult


@dataclass(frozen=True)
class FrontChunk:
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class FrontStepEnd:
    finish_reason: str | None  # "stop" (end of the reply), "length" (step budget), "abort" (cancelled)
    computed: int | None = None  # context tokens the step ran through the model (None: unknown)


@dataclass(frozen=True)
class Speculation:
    p_end: float  # probability that one of the end tokens comes right after the input
    computed: int  # context tokens the step ran through the model
    cached: int  # context tokens whose KV it found (held, or hit in the prefix cache)
    hidden: np.ndarray | None = None  # the final hidden state at the input's last token (None: not returned)


class FrontModel(Protocol):
    weights_version: str | None  # the weights the front runs (None: unknown), for the end-of-turn probe

    def encode(self, text: str) -> list[int]: ...

    def prelude(self) -> list[int]: ...

    def step(self, input_ids: list[int], max_tokens: int) -> AsyncIterator[FrontChunk | FrontStepEnd]: ...

    async def speculate(self, input_ids: list[int], end_tokens: frozenset[int], then: int) -> Speculation: ...

    async def cancel(self) -> None: ...

    async def mark(self) -> Any: ...

    async def rewind(self, mark: Any) -> None: ...

    async def truncate(self, mark: Any, keep: int) -> None: ...

    async def release(self, mark: Any) -> None: ...

    async def close(self) -> None: ...


DEFAULT_FRONT_PARAMS = SamplingParams(temperature=0.0, stop=["\n"], max_tokens=4)
SCORE_LOGPROBS = 20


class SessionFront:
    """A :class:`FrontModel` over one LM session of ``engine`` (module docstring)."""

    def __init__(self, sessions: AsyncSessions, session_id: str, prelude: list[int] | None = None,
                 logit_bias: dict[int, float] | None = None, weights_version: str | None = None) -> None:
        """``logit_bias``: the session's own (what its sampling parameters were opened with);
        ``weights_version``: the engine's (None: unknown)."""
        self.sessions = sessions
        self.session_id = session_id
        self.weights_version = weights_version
        self._tok = sessions.engine.tokenizer
        self._prelude = list(prelude or [])
        self._bias = logit_bias
        self._biased = False
        self._mark_tokens: dict[str, int] = {}  # each live mark's context length

    @classmethod
    async def open(cls, engine: AsyncEngine, system_prompt: str = "A helpful voice assistant talks with a user.",
                   sampling_params: SamplingParams | None = None, priority: int = PRIORITY_INTERACTIVE,
                   session_id: str | None = None, sessions: AsyncSessions | None = None) -> SessionFront:
        """Open the session and put ``system_prompt`` first in its context (appended at the first step).
        ``sessions``: the engine's ``AsyncSessions`` (an engine has one: pass it when anything else
        opens sessions on ``engine``); None builds one for this front."""
        if engine.tokenizer is None:
            raise ValueError("the front model needs a tokenizer")
        sessions = sessions or AsyncSessions(engine)
        params = sampling_params or DEFAULT_FRONT_PARAMS
        params = replace(params, logprobs=max(params.logprobs or 0, SCORE_LOGPROBS), return_hidden=True)
        info = await sessions.open(session_id, params, priority=priority)
        prelude = engine.tokenizer.encode(system_prompt, add_special_tokens=True) if system_prompt else []
        return cls(sessions, info.session_id, prelude, params.logit_bias, await engine.weights_version())

    def prelude(self) -> list[int]:
        return list(self._prelude)

    def encode(self, text: str) -> list[int]:
        assert self._tok is not None
        return self._tok.encode(text, add_special_tokens=False)

    async def step(self, input_ids: list[int], max_tokens: int) -> AsyncIterator[FrontChunk | FrontStepEnd]:
        if self._biased:  # a kept speculation: the session's own sampling again, from this step
            await self._sampling({"logit_bias": self._bias})
            self._biased = False
        end = FrontStepEnd(None)
        async for item in self.sessions.step(self.session_id, input=list(input_ids) or None, max_tokens=max_tokens):
            if isinstance(item, StepDelta):
                yield FrontChunk(tuple(item.token_ids), item.text)
            else:
                end = FrontStepEnd(item.finish_reason, item.num_computed_tokens)
        yield end

    async def speculate(self, input_ids: list[int], end_tokens: frozenset[int], then: int) -> Speculation:
        await self._sampling({"logit_bias": {then: 100.0}})
        self._biased = True
        result = None
        async for item in self.sessions.step(self.session_id, input=list(input_ids) or None, max_tokens=1):
            if isinstance(item, StepResult):
                result = item
        assert result is not None
        top = result.logprobs[0] if result.logprobs else {}
        p = sum(math.exp(top[t].logprob) for t in end_tokens if t in top)
        return Speculation(p, result.num_computed_tokens, result.num_cached_tokens, result.hidden)

    async def cancel(self) -> None:
        await self.sessions.cancel(self.session_id)

    async def mark(self) -> str:
        sid, a = self.session_id, self.sessions.access
        mark, n = await self.sessions.run(lambda s: (s.checkpoint(sid, a).checkpoint_id, len(s.token_ids(sid, a))))
        self._mark_tokens[mark] = n
        return mark

    async def rewind(self, mark: str) -> None:
        await self.sessions.rollback(self.session_id, mark)
        self._biased = False  # the rollback restored the session's sampling parameters

    async def truncate(self, mark: str, keep: int) -> None:
        await self.sessions.truncate(self.session_id, mark, self._mark_tokens[mark] + keep)
        self._biased = False  # as after a rewind

    async def _sampling(self, data: dict[str, Any]) -> None:
        info = await self.sessions.info(self.session_id)
        await self.sessions.submit_event(self.session_id, (info.last_event_id or 0) + 1, "sampling", data)

    async def release(self, mark: str) -> None:
        self._mark_tokens.pop(mark, None)
        await self.sessions.release_checkpoint(self.session_id, mark)

    async def close(self) -> None:
        await self.sessions.close(self.session_id)
