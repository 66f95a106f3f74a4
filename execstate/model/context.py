"""Per-step execution context handed to the model's forward pass.

The model never reaches for globals: everything a forward pass needs beyond its
weights travels in one ``StepContext``:

- ``positions``: absolute position of every token in the flat batch (RoPE).
- ``attention``: an ``AttentionBackend``; the model calls it once per layer with the
  projected, RoPE'd q/k/v of every token. The backend owns where K/V live (a paged
  pool, or nothing for the dense oracle path) and writes them in place.
- ``routes``: a ``RouteCapture`` (MoE models only) that records the top-k experts every
  MoE layer chose for every token, and optionally carries routes to *force* (replay).
- ``timers``: a ``StepTimers`` the model charges its phases to, or None (no timing).
- ``team``: a ``TeamGovernor`` that picks the kernels' team size per whole-layer call (under
  contention one thread beats a team that waits for a descheduled partner), or None.

A ``StepContext`` is a non-reentrant context manager: it is entered once around one
forward pass and cannot be nested or reused, so per-step state can never leak into
the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import torch

from execstate.kernels.team import TeamGovernor
from execstate.model.step_timers import StepTimers


class AttentionBackend(Protocol):
    """Computes attention for one layer over a flat batch of tokens.

    Contract: ``forward`` is called exactly once per layer per step, in layer order.
    ``q`` is ``[T, n_heads, head_dim]``, ``k``/``v`` are ``[T, n_kv_heads, head_dim]``
    (RoPE already applied to q and k), contiguous, in the model dtype and on the model
    device; the backend must not modify them in place. Returns ``[T, n_heads, head_dim]``
    in the same dtype. Softmax scale is ``head_dim ** -0.5``. Side effect: the backend
    may store k/v (in place, into its own storage) for later steps.
    """

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


@dataclass
class RouteCapture:
    """Records (and optionally forces) the experts of every MoE layer for a step.

    ``ids`` is ``int16[T, n_moe_layers, top_k]``; MoE layer ``m`` is the m-th MoE layer
    in increasing decoder-layer order. Each MoE layer writes its row slice exactly once
    per step via ``record``. Expert ids in a row are ordered by descending router weight.

    Replay: when ``forced_ids`` (``int64[T, n_moe_layers, top_k]``) and ``forced_mask``
    (``bool[T]``) are set, tokens whose mask is True use the forced experts instead of
    top-k; their combine weights are still taken from the live router probabilities
    (gathered at the forced ids, renormalised exactly as the architecture renormalises
    its top-k). The recorded ids of a forced token are the forced ids, in the given
    order. The model does NOT validate forced ids (range ``[0, n_experts)``, no
    duplicates in a row): the engine must, before building the capture; on CUDA an
    out-of-range id is a device-side assert that poisons the process. Any integer dtype
    and device is accepted for ``forced_ids``/``forced_mask`` (moved per layer).

    A layer that writes its ids itself (the CPU kernels' whole-layer call) may write them into
    ``slot(m)``, a contiguous int64 ``[T, top_k]`` row of one step buffer, and record that
    tensor; when every layer did, ``host_ids()`` is one numpy cast of the buffer, not a stack,
    a cast and a copy of torch ops (after a forward pass each torch call costs ~10-50 us of
    cold dispatch: ~40 us a step at batch 1, measured, where the step is ~3 ms).
    """

    num_tokens: int
    num_moe_layers: int
    top_k: int
    forced_ids: torch.Tensor | None = None
    forced_mask: torch.Tensor | None = None
    device: torch.device | str = "cpu"
    _recorded: list[torch.Tensor | None] = field(init=False, repr=False)
    _ids: torch.Tensor | None = field(init=False, repr=False)
    _buf: torch.Tensor | None = field(init=False, repr=False)
    _slots: list[torch.Tensor | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.forced_ids is None) != (self.forced_mask is None):
            raise ValueError("forced_ids and forced_mask must be given together")
        self._recorded = [None] * self.num_moe_layers
        self._ids = None
        self._buf = None
        self._slots = [None] * self.num_moe_layers

    def forced(self, moe_layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mask[T], ids[T, top_k]) of forced routes for this MoE layer, or None."""
        if self.forced_ids is None or self.forced_mask is None:
            return None
        return self.forced_mask, self.forced_ids[:, moe_layer]

    def slot(self, moe_layer: int) -> torch.Tensor:
        """A contiguous int64 ``[T, top_k]`` CPU tensor for layer ``moe_layer`` to write its ids
        into and ``record``: a row of one ``[n_moe_layers, T, top_k]`` buffer per step."""
        if self._buf is None:
            self._buf = torch.empty((self.num_moe_layers, self.num_tokens, self.top_k), dtype=torch.int64)
        s = self._slots[moe_layer] = self._buf[moe_layer]
        return s

    def host_ids(self) -> np.ndarray:
        """``ids`` as a host numpy array (``int16 [T, n_moe_layers, top_k]``, C order)."""
        buf = self._buf
        if buf is not None and self._ids is None and all(
                r is not None and r is s for r, s in zip(self._recorded, self._slots, strict=True)):
            return np.ascontiguousarray(buf.numpy().transpose(1, 0, 2), dtype=np.int16)
        return self.ids.cpu().numpy()

    def record(self, moe_layer: int, topk_ids: torch.Tensor) -> None:
        """Keep layer ``moe_layer``'s ``[T, top_k]`` integer ids (by reference: the caller
        must not modify them afterwards); a second record of a layer replaces the first."""
        self._recorded[moe_layer] = topk_ids
        self._ids = None

    @property
    def ids(self) -> torch.Tensor:
        """The recorded routes, ``int16[T, n_moe_layers, top_k]`` on the capture's device,
        assembled once after the forward pass (one stack + cast per step instead of a
        strided copy per layer). Rows of a layer that recorded nothing are unspecified."""
        if self._ids is None:
            rec = self._recorded
            if all(t is not None for t in rec) and rec:
                self._ids = torch.stack(cast("list[torch.Tensor]", rec), dim=1).to(  # every entry a tensor: checked
                    device=self.device, dtype=torch.int16)
            else:
                shape = (self.num_tokens, self.num_moe_layers, self.top_k)
                self._ids = torch.empty(shape, dtype=torch.int16, device=self.device)
                for m, t in enumerate(rec):
                    if t is not None:
                        self._ids[:, m].copy_(t)
        return self._ids


class StepContext:
    """Everything one forward pass needs besides weights. Enter exactly once."""

    def __init__(
        self,
        positions: torch.Tensor,
        attention: AttentionBackend,
        routes: RouteCapture | None = None,
        timers: StepTimers | None = None,
        team: TeamGovernor | None = None,
    ) -> None:
        self.positions = positions
        self.attention = attention
        self.routes = routes
        self.timers = timers  # a breakdown of the step's time (model/step_timers.py), or None
        self.team = team  # chooses the kernels' team size per layer call (kernels/team.py), or None
        self._state = "new"  # new -> active -> done

    def __enter__(self) -> StepContext:
        if self._state != "new":
            raise RuntimeError(f"StepContext is not reentrant (state={self._state})")
        self._state = "active"
        return self

    def __exit__(self, *exc: object) -> None:
        self._state = "done"

    def check_active(self) -> None:
        if self._state != "active":
            raise RuntimeError("model forward called outside its StepContext")
