"""What a session kind keeps per session (:class:`KindState`) and a checkpoint of it
(:class:`Checkpoint`): the contract between the generic runtime (``session/runtime/lifecycle.py``)
and each kind (``session/lm/state.py``, ``session/world/state.py``). Pure Python.

A checkpoint holds the kind's saved state (``KindState.save``: pinned resources, no copies of
tensors) plus the control state: step index, epoch, branch id and the event queue's snapshot
(pending events, id watermark, acknowledgements). It belongs to the session that made it and is
released exactly once (``Checkpoint.release`` is idempotent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from execstate.identity.keys import BlockKey
from execstate.session.runtime.events import QueueSnapshot


class Saved(Protocol):
    """A kind's saved state (inside a checkpoint); ``release`` gives its resources back, once."""

    def release(self) -> None: ...


class KindState(Protocol):
    """What a session kind keeps per session. Contract: ``save`` is cheap (pins, no tensor copy);
    ``restore`` makes this state equal to ``saved`` (releasing what it held); ``clone`` returns an
    independent state equal to ``saved`` (or to this state when None) with its own references;
    ``release`` gives every resource back (called once); ``chain`` is the state's block chain for
    its key: (the last full block's key or the provenance root, the tokens after it)."""

    def save(self) -> Saved: ...

    def restore(self, saved: Any) -> None: ...

    def clone(self, saved: Any | None) -> KindState: ...

    def release(self) -> None: ...

    def chain(self) -> tuple[BlockKey, list[int]]: ...


@dataclass(eq=False, slots=True)
class Checkpoint:
    """A session's state at a step boundary (module docstring)."""

    checkpoint_id: str
    session_id: str
    step_index: int
    event_epoch: int
    branch_id: str
    events: QueueSnapshot
    saved: Saved
    released: bool = field(default=False, init=False)

    def __repr__(self) -> str:
        """One line: identity, position and state (never the saved state: a route array, KV holds)."""
        state = "released" if self.released else "pinned"
        return (f"Checkpoint({self.checkpoint_id!r}, session={self.session_id!r}, step={self.step_index}, "
                f"epoch={self.event_epoch}, branch={self.branch_id!r}, {len(self.events.pending)} pending "
                f"event(s), {state})")

    def release(self) -> None:
        """Give the pinned state back (idempotent)."""
        if not self.released:
            self.released = True
            self.saved.release()
