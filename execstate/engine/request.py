"""A request's lifecycle state (pure Python; the scheduler and tests drive it).

States: WAITING -> RUNNING -> FINISHED_*; RUNNING -> PREEMPTED -> RUNNING (by
recompute); PD decode side: WAITING -> WAITING_FOR_REMOTE_KVS (blocks allocated, KV being
loaded from another instance, never scheduled) -> RUNNING once the load is committed, or
FINISHED_ABORTED if it failed. ``num_computed_tokens`` counts tokens whose KV is in this request's
blocks; the last token of ``all_token_ids`` has had no forward pass yet whenever the
request is decoding.

Session steps (``session/``): a request may arrive holding blocks (``block_ids`` with the KV of
its first ``num_computed_tokens`` tokens, handed over by the session); with ``keep_blocks`` its
blocks are handed back at finish (``returned_blocks``, registered in the engine's block holds)
instead of being freed, and ``on_finished(request, final_output)`` runs on the engine thread
as it finishes. ``priority`` is its scheduling class (higher first, ``engine/scheduler.py``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from execstate.engine.detokenizer import IncrementalDetokenizer
from execstate.engine.route_trace import RouteTrace
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.keys import BlockKey
from execstate.identity.scope import LOCAL_SCOPE, CacheScope
from execstate.state.block_holds import HeldBlocks
from execstate.state.block_pool import BlockId
from execstate.transfer.handoff import Handoff

if TYPE_CHECKING:
    from execstate.engine.grammar.matcher import GrammarMatcher
    from execstate.engine.outputs import Logprob, RequestOutput
    from execstate.engine.penalties import PenaltyState


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
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_model_len: int
    prompt: str | None = None
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[BlockId] = field(default_factory=list)
    # Keys of this request's full blocks, in order (chain), valid for its provenance.
    block_keys: list[BlockKey] = field(default_factory=list)
    # Block keys whose route records this request leases (released when it finishes).
    leased_keys: list[BlockKey] = field(default_factory=list)
    # Full blocks of block_ids already registered in the prefix cache (or hit from it).
    num_committed_blocks: int = 0
    num_cached_tokens: int | None = None
    # Prompt tokens whose KV was loaded from another instance (PD), not computed here.
    num_transferred_tokens: int = 0
    # Prompt tokens whose KV was reloaded from this engine's offload tiers (engine/offload.py).
    num_offloaded_tokens: int = 0
    # PD: handoff parameters received with the request / produced for the decode side.
    kv_transfer_params: dict[str, Any] | None = None
    kv_transfer_out: dict[str, Any] | None = None
    # PD decode side: the verified handoff to load from (None: nothing to load), and whether the
    # load was already started or skipped (a request loads at most once, even if preempted).
    handoff: Handoff | None = None
    kv_load_started: bool = False
    # PD decode side: bytes and time of the load that brought this request's KV.
    transfer_info: dict[str, Any] | None = None
    num_preemptions: int = 0
    routes: RouteTrace | None = None
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    abort_message: str | None = None
    # torch.Generator used for sampling (the request's own when it has a seed).
    generator: Any = None
    # Constrained decoding: the grammar's matcher state (engine/grammar/), advanced by every
    # sampled token; a session step's is the session's own (None: unconstrained).
    grammar: GrammarMatcher | None = None
    # Incremental token counts / logit bias for penalised sampling (None: no penalty used).
    penalty_state: PenaltyState | None = None
    # Who may share this request's cached state: its tenant (or shared group) and the client's
    # salt (identity/scope.py); part of the execution identity its block keys derive from.
    scope: CacheScope = LOCAL_SCOPE
    # Output state, built once per token (engine/output_builder.py): the text so far, each
    # token's logprob entry (when logprobs are asked for), the running sum of the sampled
    # logprobs, and how many tokens DELTA outputs have handed out.
    detok: IncrementalDetokenizer = field(init=False)
    output_logprob_entries: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    num_sent_tokens: int = 0
    # Session steps (module docstring): hand the blocks back at finish instead of freeing them.
    keep_blocks: bool = False
    returned_blocks: HeldBlocks | None = None
    on_finished: Callable[[Request, RequestOutput], None] | None = None

    def __post_init__(self) -> None:
        self.detok = IncrementalDetokenizer(self.params.skip_special_tokens, self.params.stop)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def remaining_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return self.num_tokens - self.num_computed_tokens

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
