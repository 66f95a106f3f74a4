"""What a forward pass hands to the step's second half (``engine/step_results.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from execstate.engine.prompt_logprobs import ScoredRows


@dataclass
class RunnerOutput:
    """``logits``: ``[n_sampling, vocab]`` fp32 on the model's device, rows in scheduled order
    (the sampler runs where they are); ``sample_rows``: index into ``sched.scheduled`` of each
    logits row; ``routes``: int16 ``[T, n_moe_layers, top_k]`` (on a GPU a view of a pinned buffer
    filled asynchronously: read it after ``wait``); ``token_offsets``: start of each scheduled
    span in the flat batch; ``done``: an event recorded after the step's device work (None on
    the CPU); ``device_step``: the torch path ran the step (``engine/device_runner.py``), so the
    sampler takes its device algorithms on any device; ``hidden``: the final hidden states of the
    logits rows, ``[n_sampling, hidden]`` fp32 on the host, when a sampling request asks for them
    (``SamplingParams.return_hidden``; None otherwise)."""

    logits: torch.Tensor
    sample_rows: list[int]
    routes: np.ndarray | None
    token_offsets: list[int]
    done: torch.cuda.Event | None = None
    device_step: bool = False  # the torch path's runner: sample with the device's algorithms
    prompt_rows: list[ScoredRows] = field(default_factory=list)  # prompt logprobs (engine/prompt_logprobs.py)
    hidden: torch.Tensor | None = None

    def wait(self) -> None:
        """Block until the step's device work (the route copy included) is done; free when the
        sampled ids were already read (the step's one sync), the one sync otherwise."""
        if self.done is not None:
            self.done.synchronize()


def hidden_rows(rows: torch.Tensor | None, scheduled: Sequence[Any], sample_rows: list[int]) -> torch.Tensor | None:
    """The logits rows' hidden states on the host (fp32), when a request sampling in this step asks
    for them (``SamplingParams.return_hidden``; ``scheduled``: the step's scheduled requests)."""
    if rows is None or not any(scheduled[i].request.params.return_hidden for i in sample_rows):
        return None
    return rows.float().cpu()
