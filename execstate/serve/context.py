"""What every endpoint of one app shares (kept on ``app.state.ctx``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from execstate.engine.async_engine import AsyncEngine, EngineDeadError
from execstate.serve.errors import OpenAIError
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.metrics import ServingMetrics


@dataclass(frozen=True)
class ServeContext:
    engine: AsyncEngine
    served_model_name: str
    metrics: ServingMetrics
    kv_transfer_config: KVTransferConfig | None = None

    def check_request(self, model: str) -> None:
        """404 unless ``model`` is the served name; 503 if the engine is dead."""
        if model != self.served_model_name:
            raise OpenAIError(
                404, f"The model `{model}` does not exist; this server serves `{self.served_model_name}`",
                param="model", code="model_not_found",
            )
        self.check_healthy()

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
