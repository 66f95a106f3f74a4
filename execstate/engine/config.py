"""Engine configuration (argument names follow vLLM's where they exist)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from execstate.engine.offload_config import validate_offload
from execstate.engine.pd_config import PDConfig
from execstate.model.step_timers import CLOCKS
from execstate.state.kv_events.config import KVEventsConfig

KERNEL_CHOICES = ("auto", "torch", "execstate")
GPU_KERNEL_CHOICES = ("auto", "triton", "torch")
KERNEL_TEAMS = ("adaptive", "full")
KV_CACHE_DTYPES = ("auto", "bfloat16")
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class EngineConfig:
    model: str | Path
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_return_routed_experts: bool = False
    seed: int = 0
    max_model_len: int | None = None
    kv_cache_memory_bytes: int = 1 << 30
    num_kv_blocks: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    # While an interactive request (a session step, e.g. an agent's front) runs or waits, requests
    # of lower classes share at most this many tokens of each step (engine/scheduler.py); None: no cap.
    interactive_batch_budget: int | None = 2
    # When an interactive request finishes, requests of lower classes get no step for this many
    # seconds, so the front's next step (sent a moment later) finds the engine free instead of
    # waiting out a batch step (engine/interactive_hold.py); 0: no hold.
    interactive_hold_s: float = 0.02
    # A request that asks for prompt logprobs runs at most this many prompt tokens per step
    # (engine/prompt_logprobs.py): the step's logits work and its length stay bounded, so the
    # requests beside it keep getting tokens.
    prompt_logprobs_chunk_tokens: int = 512
    # "execstate": few-row fp32 linears and the MoE block run on execstate's C kernels
    # (execstate.kernels.cpu; error if unavailable); "torch": torch ops only; "auto": the
    # kernels when available and the device is CPU. Recorded in the provenance numerics (the
    # two round differently). dtype "bfloat16" with the kernels: bf16 weights, fp32
    # activations and KV cache (model/bf16_weights.py); with torch ops: everything in bf16.
    kernels: str = "auto"
    # Arithmetic of the matmuls. "float32": fp32 activations and sums (with dtype "bfloat16" the
    # weights are bf16, widened). "bfloat16" (needs dtype "bfloat16" and the CPU kernels): bf16
    # arithmetic: each matmul's input rows rounded to bf16, products by vdpbf16ps (AVX512-BF16, an
    # FMA emulation elsewhere), fp32 sums in one fixed order; attention, norms, the router, the KV
    # cache and the residual stream stay fp32 (engine/model_numerics.py).
    compute_dtype: str = "float32"
    # Storage of the KV cache (vLLM's kv_cache_dtype). "auto": the activations' dtype (fp32 on the
    # CPU kernels). "bfloat16" (bf16 attention; the CPU kernels): each K/V row is rounded to bf16
    # (nearest even) when written and widened exactly when read, so attention reads half the
    # bytes; scores, softmax and P x V stay fp32 in the kernels' one order, batch-invariant as
    # ever. Any weight mode; its own numerics id (engine/model_numerics.py). Needs at most 16 query
    # heads per KV head.
    kv_cache_dtype: str = "auto"
    # "gguf": the model's GGUF file served as it is (Q8_0 / Q4_0 / Q4_1 blocks multiplied in place,
    # fp32 activations; model/gguf_model.py); None: the safetensors weights.
    quantization: str | None = None
    # Map the KV pool's pages at start, on a background thread (KVPool.populate_async), so
    # prefills into never-used blocks do not pay page faults (~4 % of an 8 x 256-token prefill
    # on the standard model); costs about 0.5 s of CPU per GiB of pool, once, and makes the
    # pool resident. Off unless asked (serve --prefault-kv, the throughput benchmark); a PD
    # consumer always maps its pool.
    prefault_kv: bool = False
    # Record every step's time by phase (model/step_timers.py: the kernels' own timers inside the
    # whole-layer decode call, timers around routing, experts, the LM head, the sampler) into
    # LLMEngine.step_timers.records, on the "wall" clock or each thread's "cpu" time. Costs a few
    # hundred clock readings a step; None (off) unless a breakdown is asked for
    # (execstate bench throughput --breakdown).
    step_timers: str | None = None
    # The CPU kernels' team size on a shared host (kernels/team.py): "adaptive" measures, layer call
    # by layer call, whether the whole team (torch.get_num_threads()) or one thread is faster and
    # runs the faster (a team waits at every barrier for a descheduled thread: 14x slower than one
    # thread at load 4 on 2 cores); "full": always the whole team. Results are the same bits.
    kernel_team: str = "adaptive"
    # Sessions (session/): at most max_sessions resident; beyond it, opening one fails
    # ("capacity") or, with session_eviction="lru", evicts the idle session whose last step is
    # the oldest (also under KV pressure). max_session_events: pending events per session
    # (beyond it an event is refused with "backpressure"). max_session_checkpoints: live
    # checkpoints per session (beyond it a checkpoint is refused with "checkpoint_limit").
    max_sessions: int = 64
    session_eviction: str | None = None
    max_session_events: int = 64
    max_session_checkpoints: int = 64
    # Offload tiers under the KV pool (engine/offload.py, docs/offload.md; all off by default): a
    # block evicted from the pool is written back to DRAM (offload_dram_bytes), local disk
    # (offload_disk_dir, at most offload_disk_bytes) and a Redis server (offload_redis_url, at
    # most offload_redis_bytes); a prompt whose blocks missed the pool but are in a tier reloads
    # them, verified, while the engine steps the others. offload_policy: which units a full tier
    # drops first ("lru" | "fifo"); offload_timeout_s: the longest a reload (and one Redis
    # command) may take before the rest is recomputed; offload_secret: the instances' shared secret
    # that signs the units (None: $EXECSTATE_KV_SECRET; without either, a per-process key signs
    # them and a Redis tier is refused).
    offload_dram_bytes: int = 0
    offload_disk_dir: str | None = None
    offload_disk_bytes: int = 16 << 30
    offload_redis_url: str | None = None
    offload_redis_bytes: int = 4 << 30
    offload_policy: str = "lru"
    offload_timeout_s: float = 1.0
    offload_secret: str | None = None
    # KV cache events (state/kv_events/recorder.py, docs/fleet.md): None or enable_kv_cache_events False
    # publishes nothing (the default); else BlockStored/BlockRemoved batches on a ZeroMQ socket.
    kv_events: KVEventsConfig | None = None
    # The PD connector (engine/pd_connector.py; vLLM's kv_transfer_config): prefill/decode
    # disaggregation and session migration in a role (kv_producer, kv_consumer, kv_both). None: no
    # connector. Built with the engine's other KV connectors (engine/llm_engine.py); the code it
    # calls (a test's importer, the metrics hook) is an LLMEngine argument, not configuration.
    kv_transfer: PDConfig | None = None
    # The torch path's kernels (docs/performance.md, "GPU"): "auto" (the Triton kernels on a CUDA
    # device where Triton is installed, else torch ops), "triton" (error where they cannot run;
    # on the CPU only under TRITON_INTERPRET=1), "torch". deterministic: batch-invariant kernels
    # (needs the Triton kernels) so R3 replay is bitwise on a GPU; enforce_eager: no CUDA graphs
    # (vLLM's name; graphs are captured for decode steps on a CUDA device only).
    gpu_kernels: str = "auto"
    deterministic: bool = False
    enforce_eager: bool = False
    # The chat template's text (vLLM's chat_template; engine/chat_template.py reads a file or text
    # given on the command line): every chat prompt is rendered with it. None: the model's own.
    chat_template: str | None = None

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {self.kernels!r}")
        if self.gpu_kernels not in GPU_KERNEL_CHOICES:
            raise ValueError(f"gpu_kernels must be one of {GPU_KERNEL_CHOICES}, got {self.gpu_kernels!r}")
        if self.step_timers not in (None, *CLOCKS):
            raise ValueError(f"step_timers must be None or one of {CLOCKS}, got {self.step_timers!r}")
        if self.kernel_team not in KERNEL_TEAMS:
            raise ValueError(f"kernel_team must be one of {KERNEL_TEAMS}, got {self.kernel_team!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; use one of {sorted(_DTYPES)}")
        self.dtype = "float32" if _DTYPES[self.dtype] is torch.float32 else "bfloat16"
        if self.compute_dtype not in _DTYPES:
            raise ValueError(f"unsupported compute_dtype {self.compute_dtype!r}; use one of {sorted(_DTYPES)}")
        self.compute_dtype = "float32" if _DTYPES[self.compute_dtype] is torch.float32 else "bfloat16"
        if self.compute_dtype == "bfloat16" and (self.dtype != "bfloat16" or self.kernels == "torch"):
            raise ValueError("compute_dtype='bfloat16' (bf16 arithmetic) needs dtype='bfloat16' and the CPU kernels "
                             f"(got dtype={self.dtype!r}, kernels={self.kernels!r})")
        if self.kv_cache_dtype in ("bf16", "bfloat16"):
            self.kv_cache_dtype = "bfloat16"
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype == "bfloat16" and self.kernels == "torch":
            raise ValueError("kv_cache_dtype='bfloat16' (bf16 attention) runs on the CPU kernels; with kernels='torch' "
                             "use dtype='bfloat16' (the whole model in bf16)")
        if self.quantization not in (None, "gguf"):
            raise ValueError(f"quantization must be None or 'gguf', got {self.quantization!r}")
        if self.quantization is not None and (self.dtype != "float32" or self.kernels == "torch"):
            raise ValueError("quantization='gguf' runs its own kernels on fp32 activations: use dtype='float32' and "
                             f"the CPU kernels (got dtype={self.dtype!r}, kernels={self.kernels!r})")
        if self.prompt_logprobs_chunk_tokens < 1:
            raise ValueError(f"prompt_logprobs_chunk_tokens must be >= 1, got {self.prompt_logprobs_chunk_tokens}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_sessions < 1 or self.max_session_events < 1:
            raise ValueError(f"max_sessions and max_session_events must be >= 1, got {self.max_sessions}, "
                             f"{self.max_session_events}")
        if self.max_session_checkpoints < 1:
            raise ValueError(f"max_session_checkpoints must be >= 1, got {self.max_session_checkpoints}")
        if self.session_eviction not in (None, "lru"):
            raise ValueError(f"session_eviction must be None or 'lru', got {self.session_eviction!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        validate_offload(self)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def bf16_weights(self) -> bool:
        """Whether the engine keeps bf16 weights with fp32 activations (dtype bfloat16 on the
        kernels; the matmuls in ``compute_dtype``); else the weights, activations and KV cache are
        all in ``torch_dtype``."""
        return self.dtype == "bfloat16" and self.use_cpu_kernels()

    def use_cpu_kernels(self) -> bool:
        """Whether the engine runs execstate's CPU kernels (see ``kernels``)."""
        from execstate.kernels import cpu as cpu_kernels

        fits = torch.device(self.device).type == "cpu"
        if self.kernels == "execstate":
            if not fits:
                raise ValueError(f"kernels='execstate' needs device cpu, got {self.device}")
            if not cpu_kernels.available():
                raise ValueError(f"kernels='execstate' but {cpu_kernels.unavailable_reason()}")
            return True
        return self.kernels == "auto" and fits and cpu_kernels.available()

    def use_triton(self) -> bool:
        """Whether the torch path runs the Triton kernels (see ``gpu_kernels``); ``ValueError`` when
        asked for where they cannot run, or for ``deterministic`` without them."""
        from execstate.kernels.family import triton_available, triton_runs_on

        if self.use_cpu_kernels():
            if self.deterministic:
                raise ValueError("deterministic=True is the torch path's mode; execstate's CPU kernels are "
                                 "deterministic already (use kernels='torch' for the GPU path)")
            return False
        runs = triton_runs_on(self.device)
        if self.gpu_kernels == "triton" and not runs:
            why = ("triton is not installed" if not triton_available()
                   else f"device {self.device} (CUDA only, or the CPU under TRITON_INTERPRET=1)")
            raise ValueError(f"gpu_kernels='triton' cannot run: {why}")
        use = self.gpu_kernels == "triton" or (self.gpu_kernels == "auto" and runs
                                               and torch.device(self.device).type == "cuda")
        if self.deterministic and not use:
            raise ValueError("deterministic=True needs the Triton kernels (gpu_kernels 'triton', or 'auto' on a "
                             "CUDA device with triton installed)")
        return use
