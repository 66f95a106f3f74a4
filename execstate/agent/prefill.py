"""The user's turn prefilled while they speak, and scored for its end (``DuplexAgent``'s collaborator).

While the user holds the floor and no reply is in flight, each new partial transcript of their
turn is sent to the front *speculatively*: at the first one a checkpoint (*base*) is taken, and
every speculation is one front step (``FrontModel.speculate``) of::

    what the next step would send anyway (``FrontContext.peek``: replay, pending segments)
    + the user turn as it would enter the context (``user_prefix`` + the partial)

that computes their KV and reads the probability that the turn ends there. With an end-of-turn
probe (``probe``, ``agent/end_probe.py``: a logistic regression trained for the front model) and
a front that returns the step's final hidden state, the score is the probe's on that state;
otherwise (and always as ``mass``) it is the mass of the *end tokens* next: the end-of-turn
token (the first token of ``agent_prefix``: what the model writes where a user turn ends) and the
sentence-final marks ``.?!`` (a recognizer that does not punctuate leaves them out, and a small
model puts one before its end-of-turn token). LiveKit's turn detector reads such a probability
from a small fine-tuned LM; here it is the front model itself, which already holds the
conversation.

The front keeps what the speculations computed across revisions, at token granularity: before a
speculation it is truncated (``FrontModel.truncate``: back to *base*, keeping the next tokens it
holds) to the longest common prefix of what it holds past *base* and the new input, and only the
rest is sent. A partial that adds words computes those words; one that revises its last word
computes from that word on.

The token a speculation appends after the turn is the first token of the reply cue (the front
samples it whatever its distribution: ``FrontModel.speculate``'s ``then``). When the turn ends,
the reply's first step keeps the longest common prefix of its input and what the front holds the
same way (``keep``: the base checkpoint becomes the reply's own mark, taken at the same boundary)
and sends the rest: with the words last speculated, only the rest of the cue, and its first token
comes from one decode step. With nothing in common (a result came in between) the front is
rolled back to *base* (``settle``), as before anything else touches the front (a truncation, a
result).

**The reply's first step, drafted.** Once a speculation scored its words at least ``draft_above``
(the turn is likely over) while ``draft_while()`` holds (the turn cannot end yet: the turn policy
still waits for the segment's end or the recognizer's final; a draft started as the turn ends
would only delay the reply's first streamed token), the idle loop runs the reply's first step on
them ahead of time (``draft``): the rest of the reply cue
and one step of tokens, generated from exactly the context the reply would have (the session's own
sampling: a step restores its bias). Its chunks are held, never emitted. At the reply's first step
``keep`` hands them over only if the reply's input is token for token the input the draft was
computed on (the final transcript the same as the partial drafted, nothing appended in between):
then the reply emits them at once and its next step continues from them. Otherwise (the final
differs, a result came in, the user went on speaking) the front is truncated to the common prefix,
which drops the drafted tokens: they are never spoken.

Accounting (:class:`PrefillStats`): ``speculations``; ``computed``: tokens the speculative steps
ran through the model; ``saved``: at each reply's first step after speculations, the tokens of
its input the speculations had computed and it did not compute again; ``wasted``: ``computed -
saved`` (work on revised partials, on turns that did not end); ``kept``: the replies that kept
part of the speculation; ``drafts`` and ``drafts_kept`` (those a reply spoke). Scores:
``score`` is (text, probability) of the latest speculation (the probe's, or the mass), ``mass``
its end tokens' mass; ``on_score`` callbacks run after each.

Pure bookkeeping over the front's calls; the agent's loop is the only caller (one step at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from execstate.agent.end_probe import EndProbe
from execstate.agent.front import FrontChunk, FrontModel


@dataclass
class PrefillStats:
    speculations: int = 0
    computed: int = 0
    saved: int = 0
    kept: int = 0
    drafts: int = 0
    drafts_kept: int = 0

    @property
    def wasted(self) -> int:
        return max(self.computed - self.saved, 0)

    def add(self, other: PrefillStats) -> None:
        self.speculations += other.speculations
        self.computed += other.computed
        self.saved += other.saved
        self.kept += other.kept
        self.drafts += other.drafts
        self.drafts_kept += other.drafts_kept

    def as_dict(self) -> dict[str, int]:
        return {"speculations": self.speculations, "computed": self.computed, "saved": self.saved,
                "wasted": self.wasted, "kept": self.kept, "drafts": self.drafts, "drafts_kept": self.drafts_kept}


@dataclass(frozen=True)
class Draft:
    """A reply's first step computed ahead of time: on the input ``held[:start]`` (the words of
    ``text`` and the whole cue), its ``chunks`` and how it ended."""

    text: str
    start: int
    chunks: tuple[FrontChunk, ...]
    finish: str | None


@dataclass(frozen=True)
class Kept:
    """What a reply's first step keeps (``keep``): the base checkpoint (its mark now), how many of
    its input tokens the front holds, and the draft it speaks (None: it steps itself)."""

    mark: Any
    held: int
    draft: Draft | None


class SpeculativePrefill:
    def __init__(self, front: FrontModel, end_tokens: frozenset[int], probe: EndProbe | None = None) -> None:
        """``end_tokens``: the end-of-turn token and the sentence-final ones (empty: nothing is
        speculated); ``probe``: the end-of-turn probe for the front's model (None: the mass scores)."""
        self.front = front
        self.end_tokens = end_tokens
        self.probe = probe
        self.partial: str | None = None  # the user's turn so far (the latest partial)
        self.score: tuple[str, float] | None = None
        self.mass: float | None = None  # the latest speculation's end tokens' mass
        self.on_score: list[Callable[[str, float], None]] = []
        self.stats = PrefillStats()
        self.draft_above: float | None = None  # draft the reply once a score reaches it (None: never)
        self.draft_while: Callable[[], bool] = lambda: True  # and only while this holds (the turn cannot end yet)
        self._draft: Draft | None = None
        self._base: Any = None  # the checkpoint before the speculative steps
        self._held: list[int] = []  # what the front holds past the base (the last input, then its ``then``)
        self._spent = 0  # tokens computed by the speculations since the last reply's first step
        self._kept = 0  # tokens of the reply's input the front held (``keep``)

    @property
    def wanted(self) -> bool:
        """A partial is waiting to be speculated."""
        return bool(self.end_tokens) and self.partial is not None and (
            self.score is None or self.score[0] != self.partial)

    @property
    def draft_wanted(self) -> bool:
        """The latest partial is speculated, scored at least ``draft_above``, and not drafted yet."""
        return (self.draft_above is not None and self._draft is None and self._base is not None
                and self.score is not None and self.score[0] == self.partial and self.score[1] >= self.draft_above
                and self.draft_while())

    def clear(self) -> None:
        """The turn is over or dropped: nothing more to speculate (``settle`` still rolls back)."""
        self.partial = None

    async def _hold(self, ids: list[int]) -> int:
        """Truncate the front to the longest common prefix of what it holds past the base and
        ``ids``; returns its length."""
        n = common_prefix(self._held, ids)
        if n < len(self._held):
            await self.front.truncate(self._base, n)
            self._held = self._held[:n]
            self._draft = None  # its last token at least is gone
        return n

    async def speculate(self, head: list[int], turn_ids: list[int], then: int) -> float:
        """One speculative step of ``head + turn_ids`` (module docstring); returns the end score (the
        probe's on the step's hidden state, or the end tokens' mass)."""
        assert self.end_tokens and self.partial is not None
        text, ids = self.partial, head + turn_ids
        if self._base is None:
            self._base, self._held = await self.front.mark(), []
        n = await self._hold(ids)
        s = await self.front.speculate(ids[n:], self.end_tokens, then)
        self._held = [*ids, then]
        self.stats.speculations += 1
        self.stats.computed += s.computed
        self._spent += s.computed
        p = self.probe.prob(s.hidden) if self.probe is not None and s.hidden is not None else s.p_end
        self.score, self.mass = (text, p), s.p_end
        for fn in self.on_score:
            fn(text, p)
        return p

    async def draft(self, cue_rest: list[int], max_tokens: int) -> Draft:
        """The reply's first step on the words last speculated (module docstring): ``cue_rest`` (the
        reply cue after the token the speculation appended) and at most ``max_tokens`` tokens."""
        assert self.score is not None and self._base is not None
        chunks: list[FrontChunk] = []
        finish, computed = None, None
        async for c in self.front.step(cue_rest, max_tokens):
            if isinstance(c, FrontChunk):
                chunks.append(c)
            else:
                finish, computed = c.finish_reason, c.computed
        start = len(self._held) + len(cue_rest)
        self._held = [*self._held, *cue_rest, *(t for c in chunks for t in c.token_ids)]
        self._draft = Draft(self.score[0], start, tuple(chunks), finish)
        self.stats.drafts += 1
        n = len(cue_rest) if computed is None else computed
        self.stats.computed += n
        self._spent += n
        return self._draft

    async def keep(self, inp: list[int]) -> Kept | None:
        """A reply's first step would send ``inp``: truncate the front to what it holds of it and
        hand over the base checkpoint (the reply's mark now), how many of ``inp`` are held and,
        when ``inp`` is exactly the input a draft was computed on, the draft (the front keeps its
        tokens); None when it holds none of it (the caller settles)."""
        if self._base is None or common_prefix(self._held, inp) == 0:
            return None
        d = self._draft
        if d is not None and self._held[:d.start] == inp:
            n = len(inp)
            self.stats.drafts_kept += 1
        else:
            n, d = await self._hold(inp), None
        mark, self._base, self._held, self._draft = self._base, None, [], None
        self.stats.kept += 1
        self._kept = n
        self.score = None
        return Kept(mark, n, d)

    async def settle(self) -> None:
        """Roll the front back to the base and drop it (the front is as before the speculations)."""
        if self._base is None:
            return
        if self._held:
            await self.front.rewind(self._base)
        await self.front.release(self._base)
        self._base, self._held, self._draft = None, [], None

    def first_step(self, input_ids: list[int], computed: int | None) -> None:
        """A reply's first step sent ``input_ids`` (after the ``keep``-held tokens, if any) and ran
        ``computed`` tokens through the model."""
        if self._spent and self._kept:
            # without the speculations it would have computed the held tokens too (and the
            # base's last token, whose KV a step always computes: counted in both); a front that
            # does not say what it computed: the held tokens
            held = self._kept if computed is None else self._kept + len(input_ids) + 1 - computed
            self.stats.saved += max(min(held, self._spent), 0)
        self._kept, self._spent = 0, 0
        self.score = None


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
