"""Counts the host round-trips a piece of torch code would make on a GPU, on any device.

On a GPU, reading a device value on the host (``tolist``, ``item``, ``bool(t)``, ``.cpu()``, a
blocking copy to the host) waits until the device has drained its queue, and so do ops whose
output shape depends on the data (``nonzero``, boolean indexing, ``unique``, ``masked_select``,
``repeat_interleave`` with tensor repeats, ``bincount``); a blocking upload of host data
(``torch.tensor(list, device=...)``, ``.to(device)`` from pageable memory) stalls the host too.
On the CPU none of these costs anything, so a CPU run shows nothing, but the code that runs on a
GPU is the same: ``HostSyncCounter`` intercepts those calls (a ``TorchFunctionMode`` and a
``TorchDispatchMode``) and counts them, so the torch path's round-trips can be counted and bounded
on a machine without a GPU.

Counted as **reads** (device -> host): ``Tensor.tolist``/``numpy``/``item``/``__bool__``/``__int__``
/``__float__``/``__index__``, ``Tensor.cpu``, ``.to("cpu")`` of a tensor on another device (``.to(d)``
of a tensor already on ``d`` is a no-op everywhere: code that brings a value to the host says
``.cpu()``, ``tolist()`` or ``numpy()``), and ``copy_`` into a CPU tensor unless
``non_blocking=True`` (a copy into pinned memory that a later read orders), and the data-dependent
shapes above. Counted as **uploads**: ``torch.tensor``/``as_tensor``/``asarray`` of host data
(``torch.from_numpy`` is not: it is how pinned staging buffers are filled), and blocking
``.to(device)``/``copy_`` from a CPU tensor onto another device. On a CPU run every tensor is on
the CPU, so a blocking ``copy_`` between CPU tensors counts as a read: code meant for a GPU uses
``non_blocking=True`` for its staged copies. ``events`` lists what was counted (name and the
first frame outside torch) so a failing bound says where.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_READ_METHODS = {
    torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
    torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu,
}
_UPLOAD_FACTORIES = {torch.tensor, torch.as_tensor, torch.asarray}
_SHAPE_OPS = {
    "aten.nonzero.default", "aten.masked_select.default", "aten._unique2.default", "aten.unique_dim.default",
    "aten.unique_consecutive.default", "aten.bincount.default", "aten.repeat_interleave.Tensor",
    "aten.nonzero_numpy.default", "aten.nonzero_static.default",
}


def _is_cpu(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


@dataclass
class HostSyncCounter:
    """Context manager: ``with HostSyncCounter() as c: ...`` then ``c.reads``, ``c.uploads``, ``c.events``."""

    reads: int = 0
    uploads: int = 0
    events: list[str] = field(default_factory=list)

    def _note(self, kind: str, name: str) -> None:
        if kind == "read":
            self.reads += 1
        else:
            self.uploads += 1
        frame = next((f for f in reversed(traceback.extract_stack()[:-3])
                      if "/torch/" not in f.filename and not f.filename.endswith("/host_syncs.py")), None)
        where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else "?"
        self.events.append(f"{kind} {name} at {where}")

    def __enter__(self) -> HostSyncCounter:
        self._fn = _FunctionCounter(self)
        self._dispatch = _DispatchCounter(self)
        self._fn.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._dispatch.__exit__(*exc)
        self._fn.__exit__(*exc)


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _READ_METHODS:
            self.counter._note("read", getattr(func, "__name__", str(func)))
        elif func in _UPLOAD_FACTORIES and args and not isinstance(args[0], torch.Tensor):
            self.counter._note("upload", func.__name__)
        elif func is torch.Tensor.to and not kwargs.get("non_blocking", False) and not (
                len(args) > 2 and args[2] is True):
            target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
            if target is not None and torch.device(target) != args[0].device:
                src_cpu = args[0].device.type == "cpu"
                if _is_cpu(target):
                    self.counter._note("read", "to(cpu)")
                elif src_cpu:
                    self.counter._note("upload", "to(device)")
        elif func is torch.Tensor.copy_ and not kwargs.get("non_blocking", len(args) > 2 and args[2]):
            dst, src = args[0], args[1]
            if dst.device.type == "cpu":
                self.counter._note("read", "copy_ to host")
            elif src.device.type == "cpu":
                self.counter._note("upload", "copy_ from host")
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _bool_index(args[1]):
            self.counter._note("read", "boolean index")
        return func(*args, **kwargs)


def _bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func)
        if name in _SHAPE_OPS or (name == "aten.where.default" and len(args) == 1):
            self.counter._note("read", name)
        return func(*args, **(kwargs or {}))
