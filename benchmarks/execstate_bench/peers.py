"""The throughput benchmark's peers: one object per system under test.

Each peer loads its model in ``load()``, frees it in ``close()`` and generates with
``run(prompts, max_new_tokens, batched)``: ``batched`` = all prompts in one call (batch 8),
else one prompt at a time (batch 1). Every peer decodes greedily and never stops early
(EOS is generated like any other token), so each prompt yields exactly ``max_new_tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RunResult:
    token_ids: list[list[int]]
    seconds: float
    ttft_s: list[float] | None = None  # batch 1 only, where the peer reports it
    r3_seconds: float | None = None  # engine only: its R3Clock's growth over the run
    # CPU seconds of the timed part: a peer running in other processes (vLLM) reports theirs, the
    # engine its process's (without its prefill probe); None: the caller measures this process's
    cpu_seconds: float | None = None
    # batch 8, where the peer reports it: the wall time of a max_tokens=1 run of the batch's
    # prompts (nothing cached) just before the timed run, outside its wall time
    prefill_s: float | None = None


class Peer:
    name = "peer"
    label = "peer"
    batch8 = True
    # the peer whose greedy tokens this one's are compared with (the same numerics where there is one)
    parity_reference = "execstate_r3_on"
    # how its weights are stored, for the sweep's roofline: "fp32", "bf16" or "gguf" (the file's blocks)
    storage = "fp32"

    def load(self) -> None: ...

    def close(self) -> None: ...

    def run(self, prompts: list[list[int]], max_new_tokens: int, batched: bool) -> RunResult:
        raise NotImplementedError

    def after_warmup(self) -> None:
        """Called by the bench loop after each load's warm-up runs, before the timed runs."""

    def prefill_once(self, prompts: list[list[int]]) -> float:
        """Wall seconds of one ``max_tokens=1`` call on all of ``prompts`` (fresh: no prefix cache
        hit), for the paired prefill probes (``throughput_pairs``)."""
        raise NotImplementedError(f"{self.name} has no prefill probe")

    def report_extra(self) -> dict[str, Any]:
        """Peer-specific figures added to the peer's report entry."""
        return {}

    def threads_in_use(self, offered: int) -> int:
        """The threads this peer computes on, of the ``offered`` ones: the denominator of its CPU
        share (a peer that chose fewer threads is not starved when it keeps them busy)."""
        return offered

    def team_calls(self) -> tuple[int, int] | None:
        """The kernel team governor's (layer calls, calls on one thread) so far, or None where the
        peer has no governor: a run's difference tells how much of it ran on one thread."""
        return None


# The engine's numerics modes as bench peers: (name infix, label words, engine kwargs).
ENGINE_MODES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "fp32": ("", "", {}),
    "bf16w": ("_bf16", " bf16 weights", {"dtype": "bfloat16"}),  # fp32 arithmetic (model/bf16_weights.py)
    "bf16": ("_bf16arith", " bf16", {"dtype": "bfloat16", "compute_dtype": "bfloat16"}),  # bf16 arithmetic
    "gguf": ("_gguf", " GGUF", {"quantization": "gguf"}),  # the model's GGUF blocks (model/gguf_model.py)
    # bf16 attention (K/V stored bf16, engine/config.py kv_cache_dtype) beside fp32 and bf16 arithmetic
    "fp32kv": ("_kvbf16", " bf16 K/V", {"kv_cache_dtype": "bfloat16"}),
    "bf16kv": ("_bf16arith_kvbf16", " bf16 + bf16 K/V", {"dtype": "bfloat16", "compute_dtype": "bfloat16",
                                                          "kv_cache_dtype": "bfloat16"}),
}


class EnginePeer(Peer):
    def __init__(self, path: Path, routes: bool, dtype: str = "float32", probe_prefill: bool = True,
                 mode: str | None = None, label_detail: str = "") -> None:
        # probe_prefill: each batched run first times a max_tokens=1 run (RunResult.prefill_s);
        # off where the caller probes itself (the sweep), as for the vLLM peer. mode: a key of
        # ENGINE_MODES (default: "bf16w" for dtype bfloat16, else "fp32"); label_detail: appended
        # to the label (e.g. the GGUF file's formats)
        self.mode = mode or ("bf16w" if dtype == "bfloat16" else "fp32")
        infix, words, self.engine_kwargs = ENGINE_MODES[self.mode]
        self.path, self.routes, self.probe_prefill = path, routes, probe_prefill
        self.dtype = self.engine_kwargs.get("dtype", "float32")
        self.name = f"execstate{infix}_r3_{'on' if routes else 'off'}"
        self.label = f"execstate{words}{label_detail} (R3 {'on' if routes else 'off'})"
        self.storage = {"bf16w": "bf16", "bf16": "bf16", "bf16kv": "bf16", "gguf": "gguf"}.get(self.mode, "fp32")
        self.llm: Any = None
        self.startup_seconds: list[float] = []
        self.populate_wait_seconds: list[float] = []  # per load: the wait for the KV pool's mapping
        self.cached_tokens = 0
        self.route_rows_ok = True

    def load(self) -> None:
        from execstate import LLM

        self.llm = LLM(str(self.path), block_size=16, enable_prefix_caching=True,
                       enable_return_routed_experts=self.routes, seed=0, max_model_len=None,
                       max_num_batched_tokens=2048, max_num_seqs=64, prefault_kv=True, **self.engine_kwargs)
        self.startup_seconds.append(float(self.llm.engine.startup_seconds))
        # prefault_kv maps the KV pool on a background thread (KVPool.populate_async): the timed runs
        # wait for it, as vLLM's start allocates and touches its cache before serving. Racing it, the
        # first 8 x 256 prefills of a fresh standard-MoE engine took 1.4-1.6 s against 0.36 s.
        t0 = time.perf_counter()
        if self.llm.engine.kv_populate is not None:
            self.llm.engine.kv_populate.join()
        self.populate_wait_seconds.append(time.perf_counter() - t0)

    def close(self) -> None:
        self.llm = None

    def team_calls(self) -> tuple[int, int] | None:
        team = self.llm.engine.runner.team
        if team is None:
            return None
        parts = [team] + ([team.large] if team.large is not None else [])
        return sum(g.calls for g in parts), sum(g.solo_calls for g in parts)

    def run(self, prompts: list[list[int]], max_new_tokens: int, batched: bool) -> RunResult:
        from execstate import SamplingParams

        sp = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
        groups = [prompts] if batched else [[p] for p in prompts]
        prefill_s = self._probe_prefill(prompts) if batched and self.probe_prefill else None
        outs = []
        r3_0 = self.llm.engine.r3_clock.seconds
        cpu0, t0 = time.process_time(), time.perf_counter()
        for g in groups:
            outs += self.llm.generate([{"prompt_token_ids": p} for p in g], sp, use_tqdm=False)
        seconds = time.perf_counter() - t0
        cpu_seconds = time.process_time() - cpu0  # the timed part only (not the prefill probe)
        r3_seconds = self.llm.engine.r3_clock.seconds - r3_0
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        mc = self.llm.engine.model_config
        for o, p, t in zip(outs, prompts, tokens, strict=True):
            self.cached_tokens += int(o.num_cached_tokens or 0)
            r = o.outputs[0].routed_experts
            if self.routes and getattr(mc, "is_moe", False):
                self.route_rows_ok &= r is not None and tuple(r.shape) == (
                    len(p) + len(t) - 1, mc.num_moe_layers, mc.top_k)
        if batched:
            return RunResult(tokens, seconds, None, r3_seconds, cpu_seconds=cpu_seconds, prefill_s=prefill_s)
        ttfts = [float(o.metrics.get("ttft_s", float("nan"))) for o in outs]
        return RunResult(tokens, seconds, ttfts, r3_seconds, cpu_seconds=cpu_seconds)

    def prefill_once(self, prompts: list[list[int]]) -> float:
        from execstate import SamplingParams

        requests = [{"prompt_token_ids": p} for p in prompts]
        t0 = time.perf_counter()
        self.llm.generate(requests, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t0

    def _probe_prefill(self, prompts: list[list[int]]) -> float:
        """Seconds of a ``max_tokens=1`` run of ``prompts`` with their first token changed (no
        block of theirs or of the timed run is in the prefix cache, and the timed run hits none
        of the probe's): vLLM's peer probes the same way (execstate_bench/vllm_peer.py)."""
        vocab = self.llm.engine.model_config.vocab_size
        return self.prefill_once([[(p[0] + 1) % vocab, *p[1:]] for p in prompts])


class TransformersPeer(Peer):
    name = "transformers"

    def __init__(self, path: Path) -> None:
        import transformers

        self.path = path
        self.label = f"transformers {transformers.__version__}"
        self.model: Any = None
        self.experts_implementation: str | None = None

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=torch.float32).eval()
        self.experts_implementation = getattr(self.model.config, "_experts_implementation", None)

    def close(self) -> None:
        self.model = None

    def _generate(self, ids: Any, n: int, streamer: Any = None) -> Any:
        import torch
        from transformers import GenerationConfig

        # No eos id: like the engine's ignore_eos, an EOS argmax is emitted and generation goes
        # on (min_new_tokens would instead mask EOS and change the greedy tokens).
        gc_ = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                               pad_token_id=0, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            return self.model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=gc_, streamer=streamer
            )

    def run(self, prompts: list[list[int]], max_new_tokens: int, batched: bool) -> RunResult:
        import torch

        groups = [prompts] if batched else [[p] for p in prompts]
        tokens: list[list[int]] = []
        ttft: list[float] = []
        t0 = time.perf_counter()
        for g in groups:
            ids = torch.tensor(g, dtype=torch.long)
            clock = None if batched else _FirstTokenClock()
            out = self._generate(ids, max_new_tokens, clock)
            tokens += out[:, ids.shape[1]:].tolist()
            if clock is not None and clock.first is not None:
                ttft.append(clock.first - clock.start)
        return RunResult(tokens, time.perf_counter() - t0, ttft or None)


class _FirstTokenClock:
    """A transformers streamer that only timestamps the first generated token (batch 1).
    ``generate`` calls ``put`` with the prompt first, then once per new token."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self._puts = 0

    def put(self, value: Any) -> None:
        self._puts += 1
        if self._puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None: ...
