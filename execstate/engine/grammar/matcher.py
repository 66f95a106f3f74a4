"""The matcher state of one constrained generation: execution state that a request or a session owns.

A :class:`GrammarMatcher` is the parse state of a compiled grammar after the tokens it accepted.
Its state is a function of (the constraint, the accepted tokens), so its serialisable form,
:class:`GrammarSnapshot`, is exactly that pair: ``GrammarCompiler.restore`` compiles the constraint
and replays the tokens, giving a matcher in the same state (the same next masks) on any process.

Ownership: a request's matcher is advanced on the engine thread only (``accept`` after each
sampled token); a mask is computed from it while the forward pass runs (``engine/grammar/masks.py``)
and never while it changes. A session hands its matcher to each step's request and gets it back
advanced; a checkpoint keeps a ``copy()``, a rollback restores one, a fork clones one
(``session/lm/state.py``); migration and hibernation carry the ``snapshot()``.

``accept`` returns False when the token is not allowed (the matcher is then in an error state for
good, ``error`` says why); ``stopped`` is True once the grammar admits nothing but the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import llguidance as llg

from execstate.engine.grammar.spec import StructuredOutputsParams


@dataclass(frozen=True)
class GrammarSnapshot:
    """Serialisable matcher state: the constraint's wire form and the tokens it accepted."""

    spec: str
    token_ids: tuple[int, ...]



class GrammarMatcher:
    def __init__(self, spec: StructuredOutputsParams, matcher: llg.LLMatcher,
                 token_ids: list[int] | None = None) -> None:
        self.spec = spec
        self.ll = matcher  # read by GrammarMasks while a step's forward pass runs
        self.token_ids: list[int] = token_ids if token_ids is not None else []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def accept(self, token_id: int) -> bool:
        ok = self.ll.consume_token(token_id)
        if ok:
            self.token_ids.append(token_id)
        return ok

    @property
    def stopped(self) -> bool:
        """Nothing but the end (EOS) may follow."""
        return self.ll.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.ll.is_accepting()

    @property
    def error(self) -> str | None:
        """Why the matcher failed, in llguidance's first line (never its parser state dump), or None."""
        if not self.ll.is_error():
            return None
        first = (self.ll.get_error() or "").split("\n<state>", 1)[0].strip()
        return " ".join(first.split())[:300] or "rejected by the grammar engine"

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` accepted tokens."""
        if not 0 <= num_tokens <= len(self.token_ids):
            raise ValueError(f"cannot roll back {num_tokens} of {len(self.token_ids)} tokens")
        if num_tokens and not self.ll.rollback(num_tokens):
            raise ValueError(f"the grammar engine refused to roll back {num_tokens} tokens")
        del self.token_ids[len(self.token_ids) - num_tokens:]

    def copy(self) -> GrammarMatcher:
        """An independent matcher in the same state."""
        return GrammarMatcher(self.spec, self.ll.deep_copy(), list(self.token_ids))

    def snapshot(self) -> GrammarSnapshot:
        return GrammarSnapshot(self.spec.to_wire(), tuple(self.token_ids))
