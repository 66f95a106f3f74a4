"""The engine's model in its numerics mode, and the mode's provenance id.

``load_engine_model(path, config)`` loads the checkpoint and puts it in the mode ``config``
asks for; ``numerics_id(config)`` is the provenance numerics of that mode (two modes never share
an id, so their KV and routes never mix: ``identity/provenance.py``). Every id names the device and
the kernel family: ``<mode>+<family>``; the same torch ops on another device round differently.

| mode (config) | weights | arithmetic | numerics id |
|---|---|---|---|
| torch path (``kernels="torch"``) | ``dtype`` | torch's or Triton's, in ``dtype`` | ``eager+<family>`` (3) |
| fp32 | fp32 | fp32 (``gemm.py``) | ``eager+cpu-avx2-v2`` |
| ``dtype="bfloat16"`` | bf16 | fp32, weights widened (``gemm_bf16.py``) | ``eager+cpu-avx2-v3-bf16w`` |
| + ``compute_dtype="bfloat16"`` | bf16 | bf16 (``gemm_bf16dot.py``) | see (1) |
| ``quantization="gguf"`` | the GGUF file's blocks | fp32, blocks dequantised in registers | see (2) |
| + ``kv_cache_dtype="bfloat16"`` (any of the four) | as the mode | as the mode, K/V bf16 | ``...-kvbf16`` (4) |

(1) ``eager+cpu-avx512bf16-v2`` with AVX512-BF16, ``eager+cpu-avx2-bf16emu-v2`` elsewhere.
(2) ``eager+cpu-gguf-<formats>-v2`` (``gguf_blocks.py``), e.g. ``q41-q80`` for Q4_1 matrices
with a Q8_0 embedding.
(3) ``kernels/family.py``'s ``kernel_family``: ``cpu-torch-v1``, ``cuda-sm90-torch-v1``,
``cuda-sm90-triton-v1`` (the Triton kernels), ``cuda-sm90-triton-bi-v1`` (the deterministic mode).

(4) e.g. ``eager+cpu-avx2-v2-kvbf16``: bf16 attention (``kv_cache_dtype``). Each K/V row is
rounded to bf16 (nearest even) when written and widened exactly when read; the attention
arithmetic is the fp32 kernel's, so a bf16-KV result equals the fp32 kernel's on the rounded K/V.

Activations, attention's arithmetic and norms are fp32 in every mode on the kernels; the KV
cache too unless ``kv_cache_dtype="bfloat16"``. The C kernels' ids changed when routing moved
into C (its own softmax rounds differently from torch's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from execstate.engine.config import EngineConfig
from execstate.kernels import cpu as cpu_kernels
from execstate.kernels import gemm_bf16dot
from execstate.kernels.family import kernel_family
from execstate.kernels.gguf_blocks import gguf_kernel_set
from execstate.model.gguf_model import gguf_file, load_gguf_model, model_formats
from execstate.model.gpu_path import use_gpu_kernels
from execstate.model.loader import load_model
from execstate.model.transformer import CausalLM
from execstate.model.weight_formats import use_bf16_arithmetic

KV_BF16_SUFFIX = "-kvbf16"  # the kernel family's suffix for bf16 K/V (table note 4)


def activation_dtype(config: EngineConfig) -> torch.dtype:
    """dtype of the activations (and of the KV cache unless ``kv_cache_dtype`` says otherwise)."""
    return torch.float32 if config.use_cpu_kernels() else config.torch_dtype


def kv_cache_dtype(config: EngineConfig) -> torch.dtype:
    """dtype of the KV pool: bf16 for ``kv_cache_dtype="bfloat16"`` (the CPU kernels; ``ValueError``
    where they cannot run), else the activations'."""
    if config.kv_cache_dtype == "bfloat16":
        if not config.use_cpu_kernels():
            raise ValueError(f"kv_cache_dtype='bfloat16' needs the CPU kernels: "
                             f"{cpu_kernels.unavailable_reason() or 'device ' + str(config.device)}")
        return torch.bfloat16
    return activation_dtype(config)


def load_engine_model(path: Path, config: EngineConfig) -> CausalLM:
    """The checkpoint at ``path`` in ``config``'s numerics mode, kernels switched as configured.
    ``ValueError`` for a mode this machine cannot run."""
    kernels = config.use_cpu_kernels()
    if config.compute_dtype == "bfloat16" and not kernels:
        raise ValueError(f"compute_dtype='bfloat16' needs the CPU kernels: {cpu_kernels.unavailable_reason()}")
    if config.quantization == "gguf":
        if not kernels:
            raise ValueError(f"quantization='gguf' needs the CPU kernels: {cpu_kernels.unavailable_reason()}")
        model = load_gguf_model(path, gguf_file(path), device=config.device)
        model.use_cpu_kernels(True)
        return model
    if not any(path.glob("*.safetensors")) and any(path.glob("*.gguf")):
        raise ValueError(f"{path} holds a GGUF file and no safetensors: serve it with quantization='gguf'")
    model = load_model(path, dtype=activation_dtype(config), device=config.device)
    if config.bf16_weights():
        model.store_weights_bf16()
        if config.compute_dtype == "bfloat16":
            use_bf16_arithmetic(model)
    model.use_cpu_kernels(kernels)
    if not kernels:  # the torch path: Triton kernels and the deterministic mode (model/gpu_path.py)
        use_gpu_kernels(model, config.use_triton(), config.deterministic)
    return model


def numerics_id(config: EngineConfig, model: CausalLM) -> str:
    """The provenance numerics of ``config``'s mode for ``model`` (the table in the module docstring)."""
    if not config.use_cpu_kernels():
        family = kernel_family(config.device, triton=config.use_triton(), deterministic=config.deterministic)
        return f"eager+{family}"
    if config.quantization == "gguf":
        family = gguf_kernel_set(model_formats(model))
    elif config.compute_dtype == "bfloat16":
        family = gemm_bf16dot.kernel_set()
    else:
        family = cpu_kernels.KERNEL_SET_BF16 if config.bf16_weights() else cpu_kernels.KERNEL_SET
    return f"eager+{family}{KV_BF16_SUFFIX if config.kv_cache_dtype == 'bfloat16' else ''}"
