"""A model-free front for the agent tests: characters are tokens (``ord``), each response is a
fixed reply generated one character per token, ``token_delay`` seconds per token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from execstate.agent.front import FrontChunk, FrontStepEnd

AGENT_PREFIX = "\nAgent:"


class FakeFront:
    def __init__(self, reply: str = " one two three four five six seven eight.", token_delay: float = 0.002,
                 prelude: str = "SYS") -> None:
        self.reply = reply
        self.token_delay = token_delay
        self._prelude = prelude
        self.context: list[int] = []
        self.marks: dict[int, list[int]] = {}
        self._n = 0
        self._pos = 0
        self._cancel = False
        self.steps = 0
        self.cancels = 0
        self.closed = False
        self.stepping = False

    @property
    def text(self) -> str:
        return "".join(map(chr, self.context))

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def prelude(self) -> list[int]:
        return self.encode(self._prelude)

    async def step(self, input_ids: list[int], max_tokens: int) -> AsyncIterator[FrontChunk | FrontStepEnd]:
        assert not self.stepping, "one step at a time"
        self.stepping = True
        self.steps += 1
        self._cancel = False
        try:
            self.context += input_ids
            if AGENT_PREFIX in "".join(map(chr, input_ids)):
                self._pos = 0
            for _ in range(max_tokens):
                await asyncio.sleep(self.token_delay)
                if self._cancel:
                    yield FrontStepEnd("abort")
                    return
                if self._pos >= len(self.reply):
                    self.context.append(ord("\n"))
                    yield FrontChunk((ord("\n"),), "")
                    yield FrontStepEnd("stop")
                    return
                c = self.reply[self._pos]
                self._pos += 1
                self.context.append(ord(c))
                yield FrontChunk((ord(c),), c)
            yield FrontStepEnd("length")
        finally:
            self.stepping = False

    async def cancel(self) -> None:
        self.cancels += 1
        self._cancel = True

    async def mark(self) -> int:
        assert not self.stepping
        self._n += 1
        self.marks[self._n] = list(self.context)
        return self._n

    async def rewind(self, mark: int) -> None:
        assert not self.stepping
        self.context = list(self.marks[mark])

    async def release(self, mark: int) -> None:
        del self.marks[mark]

    async def close(self) -> None:
        self.closed = True
