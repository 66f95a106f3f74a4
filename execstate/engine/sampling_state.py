"""A request's sampling state (set by ``engine/intake.py`` / ``engine/step_request.py``, read by
``engine/sampler.py`` each step).

``generator``: the torch generator its noise is drawn from (its own when it has a seed, so its
tokens do not depend on its batch mates; a session step's is the session's, drawn in place);
``penalties``: the incremental token counts and logit bias of penalised sampling
(``engine/penalties.py``; None: no penalty or bias used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from execstate.engine.penalties import PenaltyState


@dataclass(eq=False)
class SamplingState:
    generator: torch.Generator | None = None
    penalties: PenaltyState | None = None
