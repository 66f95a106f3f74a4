"""The engine's model in its numerics mode, and the mode's provenance id.

``load_engine_model(path, config)`` loads the checkpoint and puts it in the mode ``config``
asks for; ``numerics_id(config)`` is the provenance numerics of that mode (two modes never share
an id, so their KV and routes never mix: ``identity/provenance.py``). Every id names the device and
the kernel family: ``<mode>+<family>``; the same torch ops on another device round differently.

| mode (config) | weights | arithmetic | numerics id |
|---|---|---|---|
| torch path (``kernels="torch"``) | ``dtype`` | torch's or Triton's, in ``dtype`` | ``eager+<family>`` (3) |
| fp32 | fp32 | fp32 (``gemm.py``) | ``eager+cpu-avx2-v1`` |
| ``dtype="bfloat16"`` | bf16 | fp32, weights widened (``gemm_bf16.py``) | ``eager+cpu-avx2-v2-bf16w`` |
| + ``compute_dtype="bfloat16"`` | bf16 | bf16 (``gemm_bf16dot.py``) | see (1) |
| ``quantization="gguf"`` | the GGUF file's blocks | fp32, blocks dequantised in registers | see (2) |

(1) ``eager+cpu-avx512bf16-v1`` with AVX512-BF16, ``eager+cpu-avx2-bf16emu-v1`` elsewhere.
(2) ``eager+cpu-gguf-<formats>-v1`` (``gguf_blocks.py``), e.g. ``q41-q80`` for Q4_1 matrices
with a Q8_0 embedding.
(3) ``kernels/family.py``'s ``kernel_family``: ``cpu-torch-v1``, ``cuda-sm90-torch-v1``,
``cuda-sm90-triton-v1`` (the Triton kernels), ``cuda-sm90-triton-bi-v1`` (the deterministic mode).

Activations, the KV cache, attention and norms are fp32 in every mode on the kernels.
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


def activation_dtype(config: EngineConfig) -> torch.dtype:
    """dtype of the activations and the KV cache."""
    return torch.float32 if config.use_cpu_kernels() else config.torch_dtype


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
        return f"eager+{gguf_kernel_set(model_formats(model))}"
    if config.compute_dtype == "bfloat16":
        return f"eager+{gemm_bf16dot.kernel_set()}"
    return f"eager+{cpu_kernels.KERNEL_SET_BF16 if config.bf16_weights() else cpu_kernels.KERNEL_SET}"
