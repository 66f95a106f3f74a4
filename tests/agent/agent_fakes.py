"""A model-free front for the agent tests: characters are tokens (``ord``), each response is a
fixed reply generated one character per token, ``token_delay`` seconds per token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from execstate.agent.front import FrontChunk, FrontStepEnd, Speculation

AGENT_PREFIX = "\nAgent:"


class FakeFront:
    def __init__(self, reply: str = " one two three four five six seven eight.", token_delay: float = 0.002,
                 prelude: str = "SYS", echo: bool = False) -> None:
        """``echo``: each reply starts with the user's last line as the context holds it at the cue
        (so a reply shows which words it was generated from)."""
        self.reply = reply
        self.echo = echo
        self.weights_version: str | None = None  # no model: the agent scores the end with the end tokens
        self._reply = reply
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
        self.speculations: list[str] = []
        self.truncations: list[int] = []  # the ``keep`` of each truncation

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
            if AGENT_PREFIX.strip() in "".join(map(chr, input_ids)):  # the cue (kept speculations send its rest)
                self._pos = 0
                heard = self.text.rsplit("User:", 1)[-1].split("\n")[0]
                self._reply = f"{heard}{self.reply}" if self.echo else self.reply
            for _ in range(max_tokens):
                await asyncio.sleep(self.token_delay)
                if self._cancel:
                    yield FrontStepEnd("abort")
                    return
                if self._pos >= len(self._reply):
                    self.context.append(ord("\n"))
                    yield FrontChunk((ord("\n"),), "")
                    yield FrontStepEnd("stop")
                    return
                c = self._reply[self._pos]
                self._pos += 1
                self.context.append(ord(c))
                yield FrontChunk((ord(c),), c)
            yield FrontStepEnd("length")
        finally:
            self.stepping = False

    async def speculate(self, input_ids: list[int], end_tokens: frozenset[int], then: int) -> Speculation:
        """A speculative step: the input appended, then ``then``; the end probability is high after
        a sentence-final mark. Every token counts as computed."""
        assert not self.stepping, "one step at a time"
        self.speculations.append("".join(map(chr, input_ids)))
        await asyncio.sleep(self.token_delay)
        self.context += [*input_ids, then]
        done = "".join(map(chr, input_ids)).rstrip()[-1:] in (".", "?", "!")
        return Speculation(0.9 if done else 0.05, len(input_ids), 0)

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

    async def truncate(self, mark: int, keep: int) -> None:
        assert not self.stepping
        base = self.marks[mark]
        assert self.context[:len(base)] == base and len(base) + keep <= len(self.context)
        self.context = self.context[:len(base) + keep]
        self.truncations.append(keep)

    async def release(self, mark: int) -> None:
        del self.marks[mark]

    async def close(self) -> None:
        self.closed = True


class Collector:
    """Consumes an agent's events into a list (start it before feeding)."""

    def __init__(self, agent) -> None:
        self.events: list = []
        self.task = asyncio.get_running_loop().create_task(self._run(agent))

    async def _run(self, agent) -> None:
        async for e in agent.events():
            self.events.append(e)

    def of(self, type_: str) -> list:
        return [e for e in self.events if e.type == type_]

    async def wait_for(self, pred, timeout: float = 10.0):
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            for e in self.events:
                if pred(e):
                    return e
            await asyncio.sleep(0.005)
        raise AssertionError("event not seen in time")


def check_invariants(events) -> None:
    """One terminal per response; no delta after its terminal or of an older epoch than the newest seen."""
    created, ended, epoch = {}, set(), 0
    for e in events:
        epoch = max(epoch, e.epoch)
        if e.type == "response.created":
            created[e.response_id] = e.epoch
        elif e.type == "response.output_text.delta":
            assert e.response_id in created and e.response_id not in ended, f"delta after terminal: {e}"
            assert e.epoch == created[e.response_id] == epoch, f"old-epoch delta: {e}"
        elif e.type == "response.done":
            assert e.response_id not in ended, f"second terminal: {e}"
            ended.add(e.response_id)
    assert set(created) == ended, "a response without a terminal event"
