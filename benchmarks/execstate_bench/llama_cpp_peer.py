"""The throughput benchmark's llama.cpp peer (llama-cpp-python), batch 1 and batched decode.

``LlamaCppPeer(gguf_path, threads, n_ctx, batch8=...)``: greedy decoding of a GGUF file (the F32
file of the same weights for the fp32 rows, ``gguf_f32``; the wheel's Q4_1 file as it is beside
the engine's GGUF mode). Batch 1 uses the high-level ``Llama.generate`` (one sequence per call,
no prefix reuse). Batch 8 (``batch8=True``) uses llama.cpp's batched decode through the
low-level API (``BatchedDecoder``: one context holding ``n`` sequences, as llama.cpp's
``batched`` example does): all prompts prefilled in one ``llama_decode`` (split by ``n_batch``),
then one ``llama_decode`` per step carrying every sequence's next token; greedy = argmax of
each sequence's logits. Its prefill probe (time to first token) is a ``max_tokens=1`` run of the
same prompts with the first token changed, as the engine's peer does. Threads: llama.cpp's best
setting, probed at each load (``best_threads``: a short greedy decode with 1 .. ``threads``
threads, the fastest kept, for prompt and generation alike): on a shared 2-core VM a starved
second thread can make llama.cpp's barriers several times slower, on a quiet one 2 are faster.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any

import numpy as np

from execstate_bench.peers import Peer, RunResult

N_BATCH = 2048  # tokens per llama_decode call (a batch-8 x 256-token prefill in one call)


class BatchedDecoder:
    """One llama.cpp context of up to ``n_seq`` sequences of at most ``seq_len`` tokens each."""

    def __init__(self, gguf_path: Path, n_seq: int, seq_len: int, threads: int) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(str(gguf_path).encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        p = lc.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_seq * seq_len, N_BATCH, min(512, N_BATCH)
        p.n_seq_max, p.n_threads, p.n_threads_batch = n_seq, threads, threads
        p.kv_unified = False  # sequences share no prefix
        self.ctx = lc.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(N_BATCH, 0, 1)
        self.n_seq = n_seq

    def close(self) -> None:
        lc = self.lc
        if self.ctx:
            lc.llama_batch_free(self.batch)
            lc.llama_free(self.ctx)
            lc.llama_model_free(self.model)
            self.ctx = self.model = None

    def _add(self, token: int, pos: int, seq: int, logits: bool) -> None:
        b, i = self.batch, self.batch.n_tokens
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq
        b.n_tokens = i + 1

    def _decode(self) -> None:
        rc = self.lc.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i: int) -> int:
        ptr = self.lc.llama_get_logits_ith(self.ctx, i)
        return int(
            np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)).argmax()
        )

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy ``max_new_tokens`` for each prompt (the last sampled token is not evaluated)."""
        if len(prompts) > self.n_seq:
            raise ValueError(f"{len(prompts)} prompts for a context of {self.n_seq} sequences")
        lc = self.lc
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        last: dict[int, int] = {}  # sequence -> batch index of its last prompt token, in this chunk
        first: dict[int, int] = {}  # sequence -> its first generated token

        def flush() -> None:
            self._decode()
            first.update({s: self._argmax(i) for s, i in last.items()})
            last.clear()
            self.batch.n_tokens = 0

        self.batch.n_tokens = 0
        for s, p in enumerate(prompts):
            for j, t in enumerate(p):
                if self.batch.n_tokens == N_BATCH:
                    flush()
                self._add(int(t), j, s, j == len(p) - 1)
                if j == len(p) - 1:
                    last[s] = self.batch.n_tokens - 1
        flush()
        out = [[first[s]] for s in range(len(prompts))]
        for step in range(1, max_new_tokens):
            self.batch.n_tokens = 0
            for s, p in enumerate(prompts):
                self._add(out[s][-1], len(p) + step - 1, s, True)
            self._decode()
            for s in range(len(prompts)):
                out[s].append(self._argmax(s))
        return out


def best_threads(gguf_path: Path, threads: int, new_tokens: int = 24) -> int:
    """llama.cpp's fastest thread count for ``gguf_path`` here and now: a greedy batch-1 decode of
    ``new_tokens`` after a 32-token prompt with each count 1 .. ``threads``, best of two each."""
    from llama_cpp import Llama

    best: tuple[float, int] | None = None
    for t in range(1, max(1, threads) + 1):
        llm = Llama(model_path=str(gguf_path), n_ctx=128, n_threads=t, n_threads_batch=t, n_batch=64,
                    logits_all=False, verbose=False)
        try:
            for _ in range(2):
                llm.reset()
                t0 = time.perf_counter()
                for i, _tok in enumerate(llm.generate(list(range(10, 42)), temp=0.0, top_k=1, reset=True)):
                    if i + 1 >= new_tokens:
                        break
                took = time.perf_counter() - t0
                best = min(best, (took, t)) if best else (took, t)
        finally:
            llm.close()
    assert best is not None
    return best[1]


class LlamaCppPeer(Peer):
    batch8 = False

    def __init__(self, gguf_path: Path, threads: int, n_ctx: int, batch8: bool = False, name: str = "llama_cpp",
                 detail: str = "F32", batch_size: int = 8, probe_prefill: bool = True) -> None:
        # probe_prefill: each batched run first times a max_tokens=1 run (off where the caller probes)
        import llama_cpp

        self.gguf_path, self.threads, self.n_ctx, self.batch8, self.name = gguf_path, threads, n_ctx, batch8, name
        self.probe_prefill = probe_prefill
        self.label = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, {detail})"
        self.batch_size = batch_size
        self.llm: Any = None
        self.batched: BatchedDecoder | None = None

    def load(self) -> None:
        from llama_cpp import Llama

        self.used_threads = best_threads(self.gguf_path, self.threads)
        self.llm = Llama(model_path=str(self.gguf_path), n_ctx=self.n_ctx, n_threads=self.used_threads,
                         n_threads_batch=self.used_threads, n_batch=256, logits_all=False, verbose=False)
        if self.batch8:
            self.batched = BatchedDecoder(self.gguf_path, self.batch_size, self.n_ctx, self.used_threads)

    def report_extra(self) -> dict[str, Any]:
        return {"threads_used": getattr(self, "used_threads", None)}

    def threads_in_use(self, offered: int) -> int:
        return getattr(self, "used_threads", None) or offered

    def close(self) -> None:
        if self.llm is not None and hasattr(self.llm, "close"):
            self.llm.close()
        if self.batched is not None:
            self.batched.close()
        self.llm = self.batched = None

    def run(self, prompts: list[list[int]], max_new_tokens: int, batched: bool) -> RunResult:
        if batched:
            if self.batched is None:
                raise RuntimeError("this llama.cpp peer runs batch 1 only")
            prefill_s = None
            if self.probe_prefill:
                fresh = [[(p[0] + 1) % self.batched.n_vocab, *p[1:]] for p in prompts]
                t0 = time.perf_counter()
                self.batched.generate(fresh, 1)
                prefill_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            batch_tokens = self.batched.generate(prompts, max_new_tokens)
            return RunResult(batch_tokens, time.perf_counter() - t0, prefill_s=prefill_s)
        tokens: list[list[int]] = []
        ttft: list[float] = []
        t0 = time.perf_counter()
        for p in prompts:
            self.llm.reset()  # no KV prefix reuse from the previous prompt
            t_start = time.perf_counter()
            out: list[int] = []
            # greedy; leaving the generator after n tokens skips the n-th token's eval, as
            # the engine does not run the last sampled token through the model either
            for tok in self.llm.generate(p, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0,
                                         repeat_penalty=1.0, reset=True):
                if not out:
                    ttft.append(time.perf_counter() - t_start)
                out.append(int(tok))
                if len(out) >= max_new_tokens:
                    break
            tokens.append(out)
        return RunResult(tokens, time.perf_counter() - t0, ttft)
