"""The kernel family of torch's own ops on a device: the part of a numerics id that names the device.

The same torch ops round differently on another device (a CPU's vectorised sums against a GPU's
tensor cores), so state computed on one must never be reused on another: every numerics id names
its family (``identity/provenance.py``). Kernels of execstate's own name their family themselves
(``kernels/``: ``cpu-avx2-v1``, ...).
"""

from __future__ import annotations

import torch


def torch_kernel_family(device: str | torch.device) -> str:
    """``torch-cpu``, ``torch-cuda-sm<major><minor>`` (the device's compute capability), or
    ``torch-<type>`` for another device type (``torch-mps``)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"torch-cuda-sm{major}{minor}"
    return f"torch-{dev.type}"
