"""The state of a world-model session: the world kind's ``KindState`` (``session/runtime/lifecycle.py``).

- :class:`WorldStore`: what every world session of one ``World`` shares: the model, the
  :class:`BlockPool` (block ids, reference counts), the :class:`KVPool` (the tensors) and the
  :class:`BlockHolds` registry through which every reference a session or checkpoint keeps is
  accounted for (``check_integrity``: each block's ``ref_count`` == the holds on it).
- :class:`WorldState`: one session's block table (one :class:`HeldBlocks` record per committed
  chunk, sink first; the rolling window drops the middle records, releasing their blocks: no
  tensor is copied), and its control state: the carry, the noise generator (its state is session
  state: rollback + the same events reproduces the same frames bit for bit), the prompt's
  cross-attention K/V (:class:`PromptKV`, with its version), the held key, the camera (a model
  with a rig: ``session/world/camera.py``), the number of chunks committed and the *history key*
  (below).
- ``save`` pins every chunk of the table (one more reference per block, no K/V copied) and
  copies the control state; ``restore`` / ``clone`` pin the saved chunks again, so a checkpoint
  stays valid after a rollback to it and a fork outlives its parent.

Identity: ``chain()`` returns the history key and no tail. The history key starts as
``block_key(root, [seed], start)`` with ``root`` the provenance root (model id, weights version,
dtype, numerics mode: eager and compiled state never share a key) and ``start`` the prompt, the
start frames' digest and the window; each committed chunk extends it with its keys, camera and
prompt version. So the session state key (``identity/session_keys.py``) names exactly what
determines the state's bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import BlockKey, block_key
from execstate.identity.provenance import Provenance, numerics_id
from execstate.kernels.family import kernel_family
from execstate.model.world.interface import Carry, PromptKV, WorldModel
from execstate.model.world.window import RollingWindow
from execstate.session.world.camera import CameraState
from execstate.session.world.events import HeldKey
from execstate.state.block_holds import BlockHolds, HeldBlocks
from execstate.state.block_pool import BlockId, BlockPool
from execstate.state.kv_pool import KVPool

_NOTHING = torch.empty(0)  # what a released state's tensors become (never written to)


def emptied(prompt: PromptKV) -> PromptKV:
    """``prompt``'s text and version without its K/V."""
    return PromptKV(prompt.version, prompt.prompt, _NOTHING, _NOTHING)


class WorldStore:
    """The model and the K/V storage shared by the sessions of one ``World``."""

    def __init__(self, model: WorldModel, num_blocks: int, block_size: int) -> None:
        spec = model.spec
        kv = spec.kv
        self.model = model
        self.block_size = block_size
        self.blocks_per_chunk = kv.blocks_per_chunk(block_size)
        self.pool = BlockPool(num_blocks)
        self.kv = KVPool(kv.num_layers, num_blocks, block_size, kv.num_kv_heads, kv.head_dim, kv.dtype)
        self.holds = BlockHolds(self.pool)
        dtype = str(kv.dtype).removeprefix("torch.")
        numerics = numerics_id(spec.numerics, kernel_family("cpu", triton=False))  # the world's pool lives on the CPU
        self.provenance = Provenance(spec.model_id, spec.weights_version, dtype, numerics)
        self.root = ExecutionIdentity(self.provenance).root

    def allocate_chunk(self) -> HeldBlocks:
        """One chunk's blocks, held (raises ``NoFreeBlocks`` when the pool is full)."""
        ids = self.pool.allocate(self.blocks_per_chunk)
        return self.holds.adopt(HeldBlocks(ids, self.blocks_per_chunk * self.block_size))

    def check_integrity(self) -> None:
        """Every block reference is held by exactly one record (no leak, no double release)."""
        self.pool.check_integrity()
        self.holds.check_integrity()
        counts = self.holds.counts()
        for b in range(self.pool.num_blocks):
            if self.pool.ref_count(BlockId(b)) != counts.get(BlockId(b), 0):
                raise AssertionError(f"block {b}: ref_count {self.pool.ref_count(BlockId(b))}, "
                                     f"held {counts.get(BlockId(b), 0)}x")


@dataclass(frozen=True)
class WorldControl:
    """The control state besides the K/V (immutable values)."""

    carry: Carry
    rng_state: torch.Tensor
    prompt: PromptKV
    held: HeldKey | None
    history: BlockKey
    n_chunks: int
    camera: CameraState | None = None


@dataclass(eq=False)
class WorldSaved:
    """A world session's saved state; ``release`` unpins its chunks once."""

    holds: BlockHolds
    table: list[HeldBlocks]
    control: WorldControl
    released: bool = field(default=False, init=False)

    def release(self) -> None:
        """Unpin the chunks once and drop the control state's tensors (a released checkpoint is
        never restored: only its prompt's text and version stay)."""
        if self.released:
            return
        self.released = True
        for rec in reversed(self.table):
            self.holds.release(rec)
        self.table = []
        c = self.control
        self.control = WorldControl(_NOTHING, _NOTHING, emptied(c.prompt), c.held, c.history, c.n_chunks, c.camera)

    def block_ids(self) -> set[int]:
        return {b for rec in self.table for b in rec.block_ids}

    def drop_table(self) -> None:
        """Unpin the chunks while the session sleeps (``session/world/hibernation.py``); the
        checkpoint stays live and gets its table back by :meth:`adopt_table` at wake."""
        for rec in reversed(self.table):
            self.holds.release(rec)
        self.table = []

    def adopt_table(self, table: list[HeldBlocks]) -> None:
        """The checkpoint's chunks again (held records, already pinned for it), once woken."""
        assert not self.table, "adopt_table over a table still held"
        self.table = table


class WorldState:
    def __init__(self, store: WorldStore, window: RollingWindow, seed: int, prompt: PromptKV, carry: Carry,
                 history: BlockKey) -> None:
        self.store = store
        self.window = window
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.table: list[HeldBlocks] = []
        self.carry = carry
        self.prompt = prompt
        self.held: HeldKey | None = None
        self.camera: CameraState | None = None if store.model.spec.camera is None else CameraState()
        self.history = history
        self.n_chunks = 0
        self.released = False

    # -- KindState ------------------------------------------------------------------------------
    def save(self) -> WorldSaved:
        return WorldSaved(self.store.holds, self._pin(self.table), self.control())

    def restore(self, saved: WorldSaved) -> None:
        self._check_saved(saved)
        table = self._pin(saved.table)
        self._drop_table()
        self.table = table
        self._load(saved.control)

    def clone(self, saved: WorldSaved | None) -> WorldState:
        src = saved if saved is not None else self.save()
        try:
            self._check_saved(src)
            new = WorldState(self.store, self.window, self.seed, src.control.prompt, src.control.carry,
                             src.control.history)
            new.table = self._pin(src.table)
            new._load(src.control)
            return new
        finally:
            if saved is None:
                src.release()

    def release(self) -> None:
        """Unpin the chunks and drop the carry and the prompt's K/V: an ended session keeps only
        what ``describe`` shows (its prompt's text and version, the chunk count), not its tensors,
        for as long as the manager remembers it. A step in flight computed from its own copies
        and finds the state released at commit."""
        if not self.released:
            self.released = True
            self._drop_table()
            self.carry, self.prompt = _NOTHING, emptied(self.prompt)

    def chain(self) -> tuple[BlockKey, list[int]]:
        return self.history, []

    # -- the world kind's own operations ----------------------------------------------------------
    def control(self) -> WorldControl:
        return WorldControl(self.carry, self.generator.get_state(), self.prompt, self.held, self.history,
                            self.n_chunks, self.camera)

    def context(self) -> list[tuple[int, ...]]:
        """Block ids per chunk of the context the next step attends to (sink first)."""
        return [tuple(int(b) for b in rec.block_ids) for rec in self.window.context(self.table)]

    def block_ids(self) -> set[int]:
        return {b for rec in self.table for b in rec.block_ids}

    def drop_kv(self) -> None:
        """Unpin the block table (the session sleeps: its chunks are in a tier); the control state stays."""
        self._drop_table()

    def append_chunk(self, rec: HeldBlocks, carry: Carry, history_step: tuple[list[int], bytes]) -> None:
        """Commit a chunk: append it, roll the window (release the middle chunks), advance."""
        self.table.append(rec)
        keep = self.window.context(self.table)
        kept = {id(r) for r in keep}
        for r in self.table:
            if id(r) not in kept:
                self.store.holds.release(r)
        self.table = list(keep)
        self.carry = carry
        tokens, extra = history_step
        self.history = block_key(self.history, [self.n_chunks, *tokens], extra)
        self.n_chunks += 1

    def _pin(self, table: list[HeldBlocks]) -> list[HeldBlocks]:
        out: list[HeldBlocks] = []
        try:
            for rec in table:
                out.append(self.store.holds.pin(rec))
        except BaseException:
            for rec in reversed(out):
                self.store.holds.release(rec)
            raise
        return out

    def _drop_table(self) -> None:
        for rec in reversed(self.table):
            self.store.holds.release(rec)
        self.table = []

    def _load(self, c: WorldControl) -> None:
        self.carry, self.prompt, self.held, self.history, self.n_chunks, self.camera = (
            c.carry, c.prompt, c.held, c.history, c.n_chunks, c.camera)
        self.generator.set_state(c.rng_state)

    def _check_saved(self, saved: WorldSaved) -> None:
        if saved.released:
            raise ValueError("this checkpoint's state was released")


def start_history(root: BlockKey, seed: int, prompt: str, start_digest: str | None, sink: int, window: int) -> BlockKey:
    """The history key of a new session (module docstring)."""
    extra = json.dumps({"prompt": prompt, "start": start_digest, "sink": sink, "window": window},
                       sort_keys=True, separators=(",", ":")).encode()
    return block_key(root, [seed], extra)


def step_history(key_ids: list[int], camera: object, prompt: PromptKV) -> tuple[list[int], bytes]:
    """What one committed chunk adds to the history key."""
    extra = json.dumps({"camera": camera, "prompt_version": prompt.version, "prompt": prompt.prompt},
                       sort_keys=True, separators=(",", ":")).encode()
    return key_ids, extra
