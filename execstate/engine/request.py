"""A request's lifecycle: a small core, plus one state object per feature (pure Python; the
scheduler and tests drive it).

States: WAITING -> RUNNING -> FINISHED_*; RUNNING -> PREEMPTED -> RUNNING (by
recompute); PD decode side: WAITING -> WAITING_FOR_REMOTE_KVS (blocks allocated, KV being
loaded from another instance, never scheduled) -> RUNNING once the load is committed, or
FINISHED_ABORTED if it failed. ``num_computed_tokens`` counts tokens whose KV is in this request's
blocks; the last token of ``all_token_ids`` has had no forward pass yet whenever the
request is decoding.

The core: ids, status (with ``stop_reason`` / ``abort_message``: why it ended), the token list,
the block table (``block_ids``, ``engine/block_table.py``: a list with an int64 mirror grown in
place, so the runners copy it without converting it) and the counters. The tokens are one list,
``all_token_ids``: the prompt, then each sampled token appended in place
(``append_output_token``, amortised O(1)); it is never rebuilt, so a step reads the span it runs
as a slice, O(tokens run), whatever the context (docs/contracts.md 8). ``output_token_ids`` is a
live view of its tail (``engine/output_token_ids.py``); ``prompt_token_ids`` is the list the
request was built with, never mutated (outputs share it).

Each feature keeps its state in its own object, set up by the feature and read by it:

- ``sampling`` (``engine/sampling_state.py``): the generator and the penalties;
- ``output`` (``engine/output_state.py``): text, logprobs and entries for outputs;
- ``cache`` (``engine/cache_state.py``): scope, block keys, route leases, committed blocks;
- ``transfer`` (``engine/transfer_state.py``): PD handoff parameters and loads;
- ``session`` (:class:`SessionLink`, below): blocks handed back at finish, the finish hook;
- ``routes`` (R3, ``engine/route_trace.py``), ``grammar`` (structured outputs,
  ``engine/grammar/``), ``prompt_scoring`` (prompt logprobs, ``engine/prompt_logprobs.py``):
  None when the request does not use the feature.

Every reader, in the engine or above it, reads a feature's state through its object
(``request.output.detok``, ``request.cache.block_keys``, ...). ``priority`` is its scheduling
class (higher first, ``engine/scheduler.py``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from execstate.engine.block_table import BlockTable
from execstate.engine.cache_state import CacheState
from execstate.engine.detokenizer import IncrementalDetokenizer
from execstate.engine.output_state import OutputState
from execstate.engine.output_token_ids import OutputTokenIds
from execstate.engine.route_trace import RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.sampling_state import SamplingState
from execstate.engine.transfer_state import TransferState
from execstate.identity.scope import LOCAL_SCOPE, CacheScope
from execstate.state.block_holds import HeldBlocks
from execstate.state.block_pool import BlockId

if TYPE_CHECKING:
    from execstate.engine.grammar.matcher import GrammarMatcher
    from execstate.engine.outputs import RequestOutput
    from execstate.engine.prompt_logprobs import PromptScoring

T = TypeVar("T")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclass(eq=False)
class SessionLink:
    """How a request ends for whoever holds its state across requests (session steps, ``session/``).

    Set by ``engine/step_request.py``; read at the end by ``engine/kv_cache_manager.py`` and
    ``engine/finisher.py``. ``keep_blocks``: at finish the request's computed blocks are handed
    back (``returned_blocks``, registered in the engine's block holds) instead of being freed;
    ``on_finished(request, final_output)`` runs on the engine thread as it finishes (at most
    once). A request that arrives holding blocks has them in ``Request.block_ids`` with the KV of
    its first ``num_computed_tokens`` tokens."""

    keep_blocks: bool = False
    returned_blocks: HeldBlocks | None = None
    on_finished: Callable[[Request, RequestOutput], None] | None = None


class Request:
    """One request (module docstring). ``scope``: who may share its cached state
    (``identity/scope.py``), kept in ``cache``."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, max_model_len: int,
                 prompt: str | None = None, priority: int = 0, scope: CacheScope = LOCAL_SCOPE) -> None:
        self.request_id = request_id
        self.params = params
        self.max_model_len = max_model_len
        self.prompt = prompt
        self.priority = priority
        self.arrival_time = time.monotonic()
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None  # the stop string or stop token id it stopped at
        self.abort_message: str | None = None
        # the tokens: the prompt as given (never mutated), and the one list of prompt then outputs
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self._outputs = OutputTokenIds(self)
        # the KV: its blocks in order (engine/block_table.py), how many of its tokens have their KV in them
        self._block_ids = BlockTable()
        self.num_computed_tokens = 0
        # counters: prompt tokens hit in the prefix cache (None: not admitted yet), loaded from
        # another instance (PD), reloaded from this engine's offload tiers (engine/offload.py)
        self.num_cached_tokens: int | None = None
        self.num_transferred_tokens = 0
        self.num_offloaded_tokens = 0
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        # per-feature state (module docstring)
        self.sampling = SamplingState()
        self.output = OutputState(IncrementalDetokenizer(params.skip_special_tokens, params.stop))
        self.cache = CacheState(scope)
        self.transfer = TransferState()
        self.session = SessionLink()
        self.routes: RouteTrace | None = None
        self.grammar: GrammarMatcher | None = None
        self.prompt_scoring: PromptScoring | None = None

    # -- the tokens ------------------------------------------------------------------------------
    @property
    def output_token_ids(self) -> OutputTokenIds:
        """The sampled tokens: a live view of ``all_token_ids`` after the prompt (no copy)."""
        return self._outputs

    @output_token_ids.setter
    def output_token_ids(self, token_ids: Sequence[int]) -> None:
        new = list(token_ids)
        del self.all_token_ids[self.num_prompt_tokens:]
        self.all_token_ids.extend(new)

    def append_output_token(self, token_id: int) -> None:
        """A sampled token joins the request (amortised O(1): the one list grows in place)."""
        self.all_token_ids.append(token_id)

    @property
    def block_ids(self) -> BlockTable:
        """Its blocks in order: a list, mirrored as an int64 array for the runners' tables."""
        return self._block_ids

    @block_ids.setter
    def block_ids(self, ids: Iterable[BlockId]) -> None:
        self._block_ids = ids if isinstance(ids, BlockTable) else BlockTable(ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def remaining_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return len(self.all_token_ids) - self.num_computed_tokens

    def chunk(self, budget: int) -> int:
        """How many tokens this request runs in a step with ``budget`` tokens left (a request that
        scores its prompt: at most its scoring's ``max_chunk_tokens``)."""
        n = min(self.remaining_tokens, budget)
        cap = self.max_chunk_tokens
        return n if cap is None else min(n, cap)

    @property
    def max_chunk_tokens(self) -> int | None:
        return self.prompt_scoring.max_chunk_tokens if self.prompt_scoring is not None else None

    # -- the end ---------------------------------------------------------------------------------
    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def max_new_tokens(self) -> int:
        room = self.max_model_len - self.num_prompt_tokens
        if self.params.max_tokens is None:
            return room
        return min(self.params.max_tokens, room)

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None

    # -- names of feature fields read outside their feature (module docstring) -----------------
