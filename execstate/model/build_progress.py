"""Progress of a first-run build of an embedded model, as plain stage lines on stderr.

A build (``registry.prepare``) runs only when the cache lacks a valid copy, so a user sees it
once, on the first ``execstate models prepare``, ``make demo`` or ``LLM("smollm2-moe")``;
the engine is silent otherwise. Each line stands alone (no terminal control codes, fine in
logs and CI) and says what is built, that it happens once, how long it usually takes, which
step runs now and the time since the build started::

    building smollm2-moe (first run only; about 10-30 s on 2 CPU cores) ...
    building smollm2-moe: step 1/4 loading the dense checkpoint ... [0.0 s]
    building smollm2-moe: step 2/4 calibrating ... [0.0 s]
    ...
    built smollm2-moe in 11.3 s: /root/.cache/execstate/models/smollm2-moe

Builders call ``step(text)`` once per entry of their module's ``BUILD_STEPS``, in order.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class BuildProgress:
    def __init__(self, name: str, num_steps: int, estimate: str | None = None, needed_by: str | None = None,
                 stream: TextIO | None = None) -> None:
        self.name = name
        self.num_steps = num_steps
        self.done_steps = 0
        why = ["first run only"] + ([f"needed by {needed_by}"] if needed_by else [])
        if estimate:
            why.append(estimate)
        self.headline = f"building {name} ({'; '.join(why)}) ..."
        self._stream = stream
        self._t0 = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def _print(self, line: str) -> None:
        print(line, file=self._stream or sys.stderr, flush=True)  # sys.stderr looked up now

    def start(self) -> None:
        self._print(self.headline)

    def step(self, what: str) -> None:
        self.done_steps += 1
        self._print(f"building {self.name}: step {self.done_steps}/{self.num_steps} {what} ... [{self.elapsed:.1f} s]")

    def finish(self, path: object) -> None:
        self._print(f"built {self.name} in {self.elapsed:.1f} s: {path}")
