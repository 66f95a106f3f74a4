"""The user's turn prefilled while they speak, and scored for its end (``DuplexAgent``'s collaborator).

While the user holds the floor and no reply is in flight, each new partial transcript of their
turn is sent to the front *speculatively*: at the first one a checkpoint (*base*) is taken, and
every speculation is one front step (``FrontModel.speculate``) of::

    what the next step would send anyway (``FrontContext.peek``: replay, pending segments)
    + the user turn as it would enter the context (``user_prefix`` + the partial)

that computes their KV and reads the probability that the turn ends there: the mass of the
*end tokens* next: the end-of-turn token (the first token of ``agent_prefix``: what the model
writes where a user turn ends) and the sentence-final marks ``.?!`` (a recognizer that does not
punctuate leaves them out, and a small model puts one before its end-of-turn token). LiveKit's
turn detector reads the same probability from a small fine-tuned LM; here it is the front model
itself, which already holds the conversation. Before the next speculation, and before anything else touches the
front (a reply's first step, a truncation, a result), the front is rolled back to *base*
(``settle``). A rollback keeps nothing appended, but the full KV blocks those steps computed
stay in the engine's prefix cache: the next step over the same tokens finds every full block of
the longest common prefix and computes only what follows it (the partial's changed words, at most
one block's worth of its common tail).

The token a speculation appends after the turn is the first token of the reply cue (the front
samples it whatever its distribution: ``FrontModel.speculate``'s ``then``). So when the turn ends
with the words last speculated, the front already holds what the reply's first step would send
up to that token: the reply keeps it (``keep``: the base checkpoint becomes the reply's own mark,
taken at the same boundary) and sends only the rest of the cue; its first token comes from one
decode step. Otherwise (the final words differ, a result came in between) the front is rolled
back and the reply finds the common full blocks in the prefix cache.

Accounting (:class:`PrefillStats`): ``speculations``; ``computed``: tokens the speculative steps
ran through the model; ``saved``: at each reply's first step after speculations, the tokens of
its input it did not send (kept) or did not compute (rolled back: input + 1 - computed, counted
only within the prefix it shares with the last speculation and within what the speculations
computed, so hits they did not cause are not theirs); ``wasted``: ``computed - saved`` (work on
revised partials, on partial tail blocks recomputed, on turns that did not end); ``kept``: the
replies that kept the speculation. Scores: ``score`` is (text, probability) of the
latest speculation; ``on_score`` callbacks run after each.

Pure bookkeeping over the front's calls; the agent's loop is the only caller (one step at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from execstate.agent.front import FrontModel


@dataclass
class PrefillStats:
    speculations: int = 0
    computed: int = 0
    saved: int = 0
    kept: int = 0

    @property
    def wasted(self) -> int:
        return max(self.computed - self.saved, 0)

    def add(self, other: PrefillStats) -> None:
        self.speculations += other.speculations
        self.computed += other.computed
        self.saved += other.saved
        self.kept += other.kept

    def as_dict(self) -> dict[str, int]:
        return {"speculations": self.speculations, "computed": self.computed, "saved": self.saved,
                "wasted": self.wasted, "kept": self.kept}


class SpeculativePrefill:
    def __init__(self, front: FrontModel, end_tokens: frozenset[int]) -> None:
        """``end_tokens``: the end-of-turn token and the sentence-final ones (empty: nothing is
        speculated)."""
        self.front = front
        self.end_tokens = end_tokens
        self.partial: str | None = None  # the user's turn so far (the latest partial)
        self.score: tuple[str, float] | None = None
        self.on_score: list[Callable[[str, float], None]] = []
        self.stats = PrefillStats()
        self._base: Any = None  # the checkpoint before the speculative steps
        self._appended = False  # the front holds speculative tokens past the base
        self._last: list[int] = []  # the last speculation's input
        self._spent = 0  # tokens computed by the speculations since the last reply's first step
        self._then: int | None = None  # the token the last speculation appended after its input

    @property
    def wanted(self) -> bool:
        """A partial is waiting to be speculated."""
        return bool(self.end_tokens) and self.partial is not None and (
            self.score is None or self.score[0] != self.partial)

    def clear(self) -> None:
        """The turn is over or dropped: nothing more to speculate (``settle`` still rolls back)."""
        self.partial = None

    async def speculate(self, head: list[int], turn_ids: list[int], then: int) -> float:
        """One speculative step of ``head + turn_ids`` (module docstring); returns the end probability."""
        assert self.end_tokens and self.partial is not None
        text = self.partial
        if self._base is None:
            self._base = await self.front.mark()
        elif self._appended:
            await self.front.rewind(self._base)
        self._appended = True
        s = await self.front.speculate(head + turn_ids, self.end_tokens, then)
        self._then = then
        self.stats.speculations += 1
        self.stats.computed += s.computed
        self._last, self._spent = head + turn_ids, self._spent + s.computed
        self.score = (text, s.p_end)
        for fn in self.on_score:
            fn(text, s.p_end)
        return s.p_end

    def keep(self, inp: list[int]) -> tuple[Any, int] | None:
        """A reply's first step would send ``inp``: when the front holds its first tokens (the last
        speculation's input and the token after it), hand over the base checkpoint (the reply's
        mark now) and how many of ``inp`` are held; else None (the caller settles)."""
        n = len(self._last)
        if self._base is None or not self._appended or len(inp) <= n or inp[:n] != self._last \
                or inp[n] != self._then:
            return None
        mark, self._base, self._appended = self._base, None, False
        self.stats.kept += 1
        self.stats.saved += min(n, self._spent)  # what the speculations computed of it, not earlier hits
        self._last, self._spent, self.score = [], 0, None
        return mark, n + 1

    async def settle(self) -> None:
        """Roll the front back to the base and drop it (the front is as before the speculations)."""
        if self._base is None:
            return
        if self._appended:
            await self.front.rewind(self._base)
        await self.front.release(self._base)
        self._base, self._appended = None, False

    def first_step(self, input_ids: list[int], computed: int | None) -> None:
        """A reply's first step sent ``input_ids`` and ran ``computed`` tokens through the model."""
        if self._spent and computed is not None:
            common = next((i for i, (a, b) in enumerate(zip(self._last, input_ids, strict=False)) if a != b),
                          min(len(self._last), len(input_ids)))
            self.stats.saved += max(min(common, len(input_ids) + 1 - computed, self._spent), 0)
        self._last, self._spent = [], 0
        self.score = None
