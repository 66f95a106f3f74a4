"""What every endpoint of one app shares (kept on ``app.state.ctx``).

Prompt work (tokenising, chat templating, prompt validation) runs in ``workers``, a
small thread pool of its own, never on the event loop (``in_worker``); the tokenizer
releases the GIL while it encodes, so ``/health`` and the streams of other requests
keep being served meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import InitVar, dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from execstate.engine.async_engine import Admission, AsyncEngine, EngineDeadError, EngineOverloadedError
from execstate.engine.sampling_params import SamplingParams
from execstate.engine.validation import validate_sampling
from execstate.identity.scope import CacheScope, PrefixSharing
from execstate.serve.auth import scope_tenant
from execstate.serve.errors import OpenAIError, bad_request, param_of
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.limits import ServingLimits
from execstate.serve.metrics import ServingMetrics
from execstate.session.lm.async_sessions import AsyncSessions
from execstate.session.runtime.manager import SessionPolicy
from execstate.transfer.handoff import Handoff, HandoffError, HandoffTrust, wants_remote_prefill

T = TypeVar("T")
logger = logging.getLogger(__name__)

# Threads tokenising and templating prompts (the tokenizer releases the GIL).
PROMPT_WORKERS = 4


def _prompt_workers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(PROMPT_WORKERS, thread_name_prefix="execstate-prompt")


def _grammar_workers() -> ThreadPoolExecutor:
    # Structured-output compiles (serve/openai/structured.py), apart from the prompt workers.
    return ThreadPoolExecutor(2, thread_name_prefix="execstate-grammar")


@dataclass(frozen=True)
class ServeContext:
    engine: AsyncEngine
    served_model_name: str
    metrics: ServingMetrics
    kv_transfer_config: KVTransferConfig | None = None
    limits: ServingLimits = field(default_factory=ServingLimits)
    workers: ThreadPoolExecutor = field(default_factory=_prompt_workers)
    handoff_trust: HandoffTrust | None = None
    grammar_workers: ThreadPoolExecutor = field(default_factory=_grammar_workers)
    sessions: AsyncSessions = field(init=False)  # the engine's LM sessions, shared by every surface
    shared_sessions: InitVar[AsyncSessions | None] = None  # the engine's, when another app serves it too
    policy: InitVar[SessionPolicy | None] = None  # bounds on the sessions (idle expiry, quotas, checkpoints)
    sharing: PrefixSharing = field(default_factory=PrefixSharing)  # the operator's shared prefix groups
    routes_by_default: bool = True  # a completion returns its routes unless it asks not to (see wants_routes)

    def __post_init__(self, shared_sessions: AsyncSessions | None, policy: SessionPolicy | None) -> None:
        object.__setattr__(self, "sessions", shared_sessions or AsyncSessions(self.engine, policy, self.sharing))

    def scope_of(self, raw: Request, cache_salt: object = None) -> CacheScope:
        """The cache scope of a request: the caller's tenant (from its API key) under the operator's
        sharing groups, narrowed by the body's ``cache_salt`` (``ValueError`` naming a bad one)."""
        return self.sharing.scope(scope_tenant(raw.scope), cache_salt)

    def wants_routes(self, asked: bool | None) -> bool:
        """Whether a completion's choices carry ``routed_experts``: the request's
        ``return_routed_experts`` when given, else ``routes_by_default`` (vLLM's behaviour, every
        answer with routes, under ``--enable-return-routed-experts``; only the answers that ask, under
        ``--routed-experts-on-request``). Never when the engine records no routes; asking such a
        server is a 400."""
        if asked and not self.engine.return_routes:
            raise bad_request("this server returns no routes: it serves a MoE model started with "
                              "--enable-return-routed-experts or --routed-experts-on-request only",
                              param="return_routed_experts")
        return self.engine.return_routes and (self.routes_by_default if asked is None else asked)

    def check_request(self, model: str) -> None:
        """404 unless ``model`` is the served name; 503 if the engine is dead."""
        if model != self.served_model_name:
            raise OpenAIError(
                404, f"The model `{model}` does not exist; this server serves `{self.served_model_name}`",
                param="model", code="model_not_found",
            )
        self.check_healthy()

    def accept_kv_transfer_params(self, params: dict[str, Any] | None) -> dict[str, Any] | Handoff | None:
        """What the engine gets for the body's ``kv_transfer_params``: a verified ``Handoff`` when
        they ask to load KV (400 unless P signed them or names an allow-listed P; checked here,
        before the engine, so D never dials an address a client invented), else them unchanged."""
        if not wants_remote_prefill(params):
            return params
        assert params is not None
        if self.handoff_trust is None:
            raise OpenAIError(400, "kv_transfer_params.do_remote_prefill: this server does not load KV from "
                                   "other instances (no kv_consumer connector)", param="kv_transfer_params")
        try:
            return self.handoff_trust.accept(params)
        except HandoffError as e:
            raise OpenAIError(400, str(e), param="kv_transfer_params", code="invalid_handoff") from None

    def check_healthy(self) -> None:
        if not self.engine.is_healthy:
            raise engine_dead(self.engine.error)

    def check_sampling(self, params: SamplingParams) -> None:
        """400 for sampling parameters this model cannot serve (e.g. stop ids outside its vocabulary)."""
        try:
            validate_sampling(params, self.engine.model_config.vocab_size)
        except ValueError as exc:
            raise bad_request(str(exc), param=param_of(str(exc))) from None

    def admit(self, count: int) -> Admission:
        """Reserve ``count`` engine requests in the waiting queue: 429 when it is full."""
        try:
            return self.engine.admit(count)
        except EngineOverloadedError as exc:
            raise overloaded(exc) from None
        except ValueError as exc:
            raise bad_request(str(exc), param="n") from None
        except EngineDeadError as exc:
            raise engine_dead(exc) from None

    async def in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the prompt worker pool, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.workers, fn, *args)


def engine_dead(err: BaseException | None) -> OpenAIError:
    return OpenAIError(503, f"the engine is not serving: {err}", type="server_error", code="engine_dead")


def overloaded(exc: EngineOverloadedError) -> OpenAIError:
    return OpenAIError(
        429, str(exc), code="rate_limit_exceeded", headers={"Retry-After": str(exc.retry_after_s)}
    )


def as_openai_error(exc: Exception) -> OpenAIError:
    """The error body for a failure after a stream has started (sent in-band). A failure that is not
    the request's own (a bug: 500) is logged with its traceback, which the client never sees."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return engine_dead(exc)
    if isinstance(exc, EngineOverloadedError):
        return overloaded(exc)
    if isinstance(exc, ValueError):
        return OpenAIError(400, str(exc))
    logger.error("a stream failed after it started", exc_info=exc)
    return OpenAIError(500, f"internal error: {exc!r}")


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
