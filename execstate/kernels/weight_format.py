"""How a matrix is stored and which kernel family multiplies it (the codes are the C side's ES_FMT_*).

- ``F32``, ``BF16``: fp32 arithmetic on fp32 or bf16 (widened) weights (``gemm.py``, ``gemm_bf16.py``).
- ``BF16_DOT``: bf16 arithmetic (``gemm_bf16dot.py``): bf16 weights, input rows rounded to bf16.
- ``Q8_0``, ``Q4_0``, ``Q4_1``: GGUF blocks as stored in the file (``gguf_blocks.py``), weights
  dequantised in registers, fp32 activations and sums.
"""

from __future__ import annotations

from enum import IntEnum

import torch


class WeightFormat(IntEnum):
    F32 = 0
    BF16 = 1
    BF16_DOT = 2
    Q8_0 = 3
    Q4_0 = 4
    Q4_1 = 5

    @property
    def quantized(self) -> bool:
        return self >= WeightFormat.Q8_0

    def storage(self, rows: int, cols: int) -> tuple[tuple[int, int], torch.dtype]:
        """(shape, dtype) of a ``[rows, cols]`` matrix stored in this format (GGUF: ``cols`` a
        multiple of 32, each row its blocks' bytes)."""
        if self is WeightFormat.F32:
            return (rows, cols), torch.float32
        if self in (WeightFormat.BF16, WeightFormat.BF16_DOT):
            return (rows, cols), torch.bfloat16
        if cols % GGUF_BLOCK:
            raise ValueError(f"{self.name}: {cols} columns is not a multiple of {GGUF_BLOCK}")
        return (rows, cols // GGUF_BLOCK * GGUF_BLOCK_BYTES[self]), torch.uint8


GGUF_BLOCK = 32  # values per GGUF block (Q8_0, Q4_0, Q4_1)
# Bytes per block: an fp16 scale (and for Q4_1 an fp16 minimum) + 32 int8 or 32 4-bit values.
GGUF_BLOCK_BYTES = {WeightFormat.Q8_0: 34, WeightFormat.Q4_0: 18, WeightFormat.Q4_1: 20}
