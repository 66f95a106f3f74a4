"""What a request's outputs are built from, kept per token (owned by ``engine/output_builder.py``).

``on_new_token`` fills it once per sampled token (O(1)): the text so far (``detok``, incremental),
the sampled token's logprob and its top alternatives (``logprobs``, ``top_logprobs``, appended
by the step), each token's logprob entry when logprobs are asked for (``logprob_entries``, built
once, never rebuilt), the running sum of the sampled logprobs, and the stop string or stop token
id that stopped the request (``stop_reason``). ``num_sent_tokens``: how many tokens ``DELTA``
outputs have handed out; ``hidden``: the final hidden state where the first token was sampled, when
the sampling parameters ask for it (``return_hidden``; set by the step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from execstate.engine.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    import numpy as np

    from execstate.engine.outputs import Logprob


@dataclass(eq=False)
class OutputState:
    detok: IncrementalDetokenizer
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    logprob_entries: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    num_sent_tokens: int = 0
    stop_reason: int | str | None = None
    hidden: np.ndarray | None = None  # SamplingParams.return_hidden: float32[hidden] where the first token was sampled
