"""What every endpoint of one app shares (kept on ``app.state.ctx``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from execstate.engine.async_engine import AsyncEngine, EngineDeadError
from execstate.serve.errors import OpenAIError
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.metrics import ServingMetrics
from execstate.transfer.handoff import Handoff, HandoffError, HandoffTrust, wants_remote_prefill


@dataclass(frozen=True)
class ServeContext:
    engine: AsyncEngine
    served_model_name: str
    metrics: ServingMetrics
    kv_transfer_config: KVTransferConfig | None = None
    handoff_trust: HandoffTrust | None = None

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


def engine_dead(err: BaseException | None) -> OpenAIError:
    return OpenAIError(503, f"the engine is not serving: {err}", type="server_error", code="engine_dead")


def as_openai_error(exc: Exception) -> OpenAIError:
    """The error body for a failure after a stream has started (sent in-band)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return engine_dead(exc)
    if isinstance(exc, ValueError):
        return OpenAIError(400, str(exc))
    return OpenAIError(500, f"internal error: {exc!r}")


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
