"""How a request ends for whoever holds its state across requests (session steps, ``session/``).

Set by ``engine/step_request.py``; read at the end by ``engine/kv_cache_manager.py`` and
``engine/finisher.py``. ``keep_blocks``: at finish the request's computed blocks are handed back
(``returned_blocks``, registered in the engine's block holds) instead of being freed;
``on_finished(request, final_output)`` runs on the engine thread as it finishes (at most once).
A request that arrives holding blocks has them in ``Request.block_ids`` with the KV of its first
``num_computed_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from execstate.state.block_holds import HeldBlocks

if TYPE_CHECKING:
    from execstate.engine.outputs import RequestOutput
    from execstate.engine.request import Request


@dataclass(eq=False)
class SessionLink:
    keep_blocks: bool = False
    returned_blocks: HeldBlocks | None = None
    on_finished: Callable[[Request, RequestOutput], None] | None = None
