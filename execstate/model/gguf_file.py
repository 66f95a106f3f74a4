"""The tensors of a GGUF file, read without parsing its metadata values (a fast path for serving).

``gguf.GGUFReader`` builds a numpy view of every metadata element: for a file that carries a
tokenizer (SmolLM2's 49k tokens and 48k merges) that takes ~11 s on this machine, against a few
milliseconds for the tensors. ``read_tensors(path)`` walks the header instead (GGUF v2/v3,
little-endian): it skips each metadata value by its length, keeps only the string values of
``WANTED_KEYS``, then reads the tensor table and maps the data section. It returns each tensor's
type name (``gguf.GGMLQuantizationType`` names: ``F32``, ``Q4_1``, ...) and its bytes as a numpy
array shaped as ``GGUFReader`` shapes them (rows x row bytes for block types, elements for F32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WANTED_KEYS = ("general.architecture",)
# ggml type id -> (name, values per block, bytes per block); only the types a server may meet here
_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
          8: ("Q8_0", 32, 34), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24)}
# metadata value types: fixed sizes (8 string, 9 array handled apart)
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    kind: str  # ggml type name, or "type<N>" for a type this reader does not size
    shape: tuple[int, ...]  # GGUF order reversed: rows first, the innermost dimension last
    data: np.ndarray  # read-only view of the file: uint8 [rows..., row bytes] (block types) or the values


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> int:
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(v)

    def string(self) -> str:
        n = self.take("Q")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_value(self, kind: int) -> None:
        if kind in _SCALAR:
            self.pos += _SCALAR[kind]
        elif kind == _STRING:
            n = self.take("Q")  # (not `pos += take()`: that would add to the position before the read)
            self.pos += n
        elif kind == _ARRAY:
            inner, count = self.take("I"), self.take("Q")
            if inner in _SCALAR:
                self.pos += _SCALAR[inner] * count
            else:
                for _ in range(count):
                    self.skip_value(inner)
        else:
            raise ValueError(f"GGUF metadata value of unknown type {kind}")


def read_tensors(path: Path) -> tuple[dict[str, str], list[GGUFTensor]]:
    """(the ``WANTED_KEYS`` string values present, every tensor) of the GGUF file at ``path``.
    The arrays are views of a private read-only mapping (copy what you keep)."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    c.pos = 4
    version = c.take("I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} (this reader takes 2 and 3)")
    n_tensors, n_kv = c.take("Q"), c.take("Q")
    meta: dict[str, str] = {}
    alignment = 32
    for _ in range(n_kv):
        key, kind = c.string(), c.take("I")
        if key in WANTED_KEYS and kind == _STRING:
            meta[key] = c.string()
        elif key == "general.alignment" and kind == 4:
            alignment = c.take("I")
        else:
            c.skip_value(kind)
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.take("Q") for _ in range(c.take("I"))]
        infos.append((name, dims, c.take("I"), c.take("Q")))
    start = -(-c.pos // alignment) * alignment
    whole = np.frombuffer(buf, dtype=np.uint8)
    tensors = []
    for name, dims, kind, offset in infos:
        shape = tuple(reversed(dims))
        if kind not in _TYPES:
            tensors.append(GGUFTensor(name, f"type{kind}", shape, whole[:0]))
            continue
        type_name, block, size = _TYPES[kind]
        n = int(np.prod(dims)) // block * size
        raw = whole[start + offset : start + offset + n]
        if block > 1:
            data = raw.reshape(*shape[:-1], shape[-1] // block * size)
        else:
            data = raw.view({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[type_name]).reshape(shape)
        tensors.append(GGUFTensor(name, type_name, shape, data))
    return meta, tensors
