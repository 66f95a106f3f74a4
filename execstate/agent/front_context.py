"""What the agent's front session is about to receive, and what it holds (``DuplexAgent``'s collaborator).

Pure bookkeeping, no I/O of its own besides the front calls it is handed. It keeps:

- the **transcript** (``transcript.py``): every token committed to the front, segment by segment,
  with a checkpoint (*mark*) before each response, so a response can be cut to what was played;
- **pending** segments: user turns, results and the like, appended at the next step's input;
- the **replay**: after a rollback to a mark, the tokens that must be sent again (what was kept
  of the cut response and everything after it), sent first in the next step's input;
- **truncations** queued by ``truncate`` / interruptions, applied at the next step boundary
  (latest item first: an earlier item's rewind re-appends the later ones, already cut, and
  releases their marks), and how many tokens each truncated response keeps (a truncation only
  ever shortens).

Call order per step boundary: ``apply_truncations`` (may rewind the front), then, before a step,
``step_input`` (takes a mark for a response's first step and drains pending + replay), then
``record_generated`` for what the step produced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from execstate.agent.front import FrontModel
from execstate.agent.transcript import Transcript


class FrontContext:
    def __init__(self, front: FrontModel) -> None:
        self.front = front
        self.transcript = Transcript()
        self._pending: list[tuple[str, list[int]]] = [("prefix", front.prelude())]
        self._replay: list[int] = []  # recorded in the transcript, to send after a rewind
        self._replay_from = 0  # segments the front holds while a replay is unsent
        self._truncs: list[tuple[str, int]] = []
        self._kept: dict[str, int] = {}  # tokens each truncated response keeps

    @property
    def replaying(self) -> bool:
        """A rollback's replay is not sent yet (the front holds less than the transcript)."""
        return bool(self._replay)

    def peek(self) -> list[int]:
        """What the next step would send before its own input (the replay, then the pending
        segments), left in place: a speculative step sends it and is rolled back."""
        return [*self._replay, *(t for _, toks in self._pending for t in toks)]

    @property
    def truncations_queued(self) -> bool:
        return bool(self._truncs)

    def push(self, role: str, token_ids: list[int]) -> None:
        """A segment for the next step's input (``user``, ``result``, ...)."""
        self._pending.append((role, token_ids))

    # -- truncation -----------------------------------------------------------------------------------
    def kept(self, response_id: str, default: int) -> int:
        return self._kept.get(response_id, default)

    def queue_truncation(self, item_id: str, keep: int, live: set[str] | None = None) -> None:
        """Cut ``item_id`` to ``keep`` generated tokens at the next boundary; ``live``: the responses
        still remembered (the kept counts of others are forgotten)."""
        self._kept[item_id] = keep
        if live is not None:
            for k in [k for k in self._kept if k not in live]:
                del self._kept[k]
        self._truncs.append((item_id, keep))

    async def apply_truncations(self, on_missing: Callable[[str], None]) -> None:
        """Rewind the front for every queued truncation (module docstring); ``on_missing(item_id)``
        for one whose mark was released since it was queued."""
        order = sorted(self._truncs, key=lambda tk: self.transcript.mark_index(tk[0])
                       if self.transcript.has_mark(tk[0]) else -1, reverse=True)
        for item_id, keep in order:
            if not self.transcript.has_mark(item_id):  # an earlier truncation re-appended it, or newer
                on_missing(item_id)                      # responses pushed its checkpoint out
                continue
            mark, tokens, released = self.transcript.plan_truncate(item_id, keep)
            await self.front.rewind(mark)
            self._replay, self._replay_from = tokens, self.transcript.mark_index(item_id)
            for m in released:
                await self.front.release(m)
        self._truncs.clear()

    # -- step input -----------------------------------------------------------------------------------
    async def step_input(self, response_id: str, first: bool, cue: list[int],
                         forced: list[int], mark: Any = None) -> list[int]:
        """The next step's input: the replay, then the pending segments; for a response's ``first``
        step a mark is taken before anything is sent (or ``mark`` is used: a checkpoint the front
        took at this same boundary, handed over), and the agent's ``cue`` and ``forced`` text
        (recorded as the response's) follow."""
        held = self._replay_from if self._replay else None  # what the front holds now, in segments
        inp, self._replay = self._replay, []
        if first:
            await self._mark(response_id, held, mark)
        for role, toks in self._pending:
            self.transcript.append(role, toks)
            inp += toks
        self._pending = []
        if first:
            self.transcript.append("prefix", cue, response_id)
            inp += cue
            if forced:
                self.transcript.append("agent", forced, response_id)
                inp += forced
        return inp

    def record_generated(self, response_id: str, token_ids: list[int]) -> None:
        self.transcript.append("agent", token_ids, response_id)

    async def _mark(self, response_id: str, held: int | None, mark: Any = None) -> None:
        if mark is None:
            mark = await self.front.mark()
        for m in self.transcript.add_mark(response_id, mark, held):
            await self.front.release(m)


