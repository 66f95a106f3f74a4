"""Names of the torch path's kernel families, for the provenance numerics id, and where Triton runs.

Two executions whose kernels round differently must never share KV or routes, so the numerics
id names the device and the kernel family that computed them. ``kernel_family(device, ...)``
returns a lowercase ``[a-z0-9.-]`` name, stable across processes and machines of one kind:

| device, mode | family |
|---|---|
| CUDA, Triton kernels (attention, MoE), cuBLAS for dense matmuls | ``cuda-sm<major><minor>-triton-v1`` |
| CUDA, deterministic (batch-invariant Triton matmuls, norms, softmax) | ``cuda-sm<major><minor>-triton-bi-v1`` |
| CUDA without Triton (torch ops only) | ``cuda-sm<major><minor>-torch-v1`` |
| any other device, torch ops | ``<device type>-torch-v1`` (e.g. ``cpu-torch-v1``, ``mps-torch-v1``) |
| the CPU under Triton's interpreter (tests) | ``cpu-triton-v1``, ``cpu-triton-bi-v1`` |

The compute capability is part of the name: Hopper (sm90) and Ampere (sm80) kernels may pick
different instructions for the same Triton code. The ``-v1`` suffix changes whenever a kernel's
order of operations changes.
"""

from __future__ import annotations

import importlib.util
import os
import re

import torch

_NAME = re.compile(r"^[a-z0-9.-]+$")


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (no import is done here)."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    """Whether Triton kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether Triton kernels can run on ``device``: compiled on a CUDA device, or under Triton's
    interpreter on the CPU (``TRITON_INTERPRET=1``: tests)."""
    dev = torch.device(device)
    return triton_available() and (dev.type == "cuda" or (dev.type == "cpu" and interpreted()))


def kernel_family(device: torch.device | str, *, triton: bool | None = None, deterministic: bool = False) -> str:
    """The kernel family the torch path uses on ``device`` (the table in the module docstring).

    ``triton``: whether the Triton kernels run (None: on a CUDA device where Triton is installed);
    ``deterministic``: the batch-invariant mode, which needs them (``ValueError`` otherwise)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        arch = f"cuda-sm{major}{minor}"
    else:
        arch = dev.type
    if triton is None:
        triton = dev.type == "cuda" and triton_available()
    if deterministic and not triton:
        raise ValueError(f"the deterministic mode needs the Triton kernels (device {dev}, triton "
                         f"{'installed' if triton_available() else 'not installed'})")
    impl = ("triton-bi" if deterministic else "triton") if triton else "torch"
    name = f"{arch}-{impl}-v1"
    assert _NAME.match(name), name
    return name
