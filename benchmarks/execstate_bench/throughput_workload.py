"""The throughput benchmark's workload: which prompts each repeat sends, how many tokens each
peer generates per prompt (docs/contracts.md 9, throughput = generated tokens / wall seconds).

``num_prompts`` prompts of ``prompt_len`` random valid token ids, ``max_new_tokens`` new
tokens each, greedy, ``ignore_eos``:

- batch 8 (``b8``): all ``num_prompts`` prompts in one call;
- batch 1 (``b1``): ``batch1_prompts`` of them one at a time (wall time includes each prefill).

Every repeat draws fresh prompts, and batch 8, batch 1 and the warm-ups draw separate sets,
so the prefix cache never hits across repeats or between the two batch shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from execstate_bench.peers import Peer, TransformersPeer


@dataclass(frozen=True)
class Workload:
    prompt_len: int = 256
    max_new_tokens: int = 128
    num_prompts: int = 8
    batch1_prompts: int = 2
    # transformers at batch 1 may be asked for fewer tokens when it is very slow (noted)
    hf_batch1_max_new_tokens: int | None = None
    seed: int = 0

    def prompts(self, vocab_size: int, repeat: int, kind: str) -> list[list[int]]:
        """Fresh prompts for (repeat, kind); kind is 'b8', 'b1', 'warmup' or 'pairs' (the paired
        prefill probes, ``throughput_pairs``: ``repeat`` numbers the pair)."""
        n = {"b8": self.num_prompts, "b1": self.batch1_prompts, "warmup": self.num_prompts,
             "pairs": self.num_prompts}[kind]
        tag = {"b8": 0, "b1": 1, "warmup": 2, "pairs": 3}[kind]
        rng = np.random.default_rng([self.seed, tag, repeat])
        return rng.integers(0, vocab_size, size=(n, self.prompt_len)).tolist()

    def new_tokens(self, peer: Peer, batched: bool) -> int:
        """New tokens per prompt that ``peer`` is asked for in one batch shape."""
        if isinstance(peer, TransformersPeer) and not batched and self.hf_batch1_max_new_tokens:
            return min(self.hf_batch1_max_new_tokens, self.max_new_tokens)
        return self.max_new_tokens

    def num_prompts_of(self, batched: bool) -> int:
        """Prompts per run of one batch shape."""
        return self.num_prompts if batched else self.batch1_prompts
