"""Host data to the device without stalling it.

A plain ``torch.tensor(values, device="cuda")`` copies from pageable memory and waits for the
device's queue to drain: one host round-trip per call. ``upload`` copies a numpy array through
pinned memory with ``non_blocking=True`` instead (the copy is queued behind the step's work; the
caching host allocator keeps the pinned block alive until the copy is done). On the CPU it is
``torch.from_numpy`` (no copy).
"""

from __future__ import annotations

import numpy as np
import torch


def upload(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device`` (a new tensor; ``values`` may be reused at once on
    the CPU only after the step's sync: do not modify it until then)."""
    host = torch.from_numpy(np.ascontiguousarray(values))
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
