"""``--kv-transfer-config``: the PD (prefill/decode) connector settings, vLLM's key names.

``KVTransferConfig.from_json(text)`` / ``from_dict(d)`` parse and validate at start-up:
every problem raises ``ValueError`` naming the offending key, and any key not listed
below is rejected (a typo must not silently disable a setting).

- ``kv_connector``: required, only ``"NixlConnector"``.
- ``kv_role``: required, ``"kv_producer"`` (prefill), ``"kv_consumer"`` (decode) or ``"kv_both"``.
- ``kv_load_failure_policy``: ``"fail"`` (default; request-level error) or ``"recompute"``
  (docs/contracts.md 5).
- ``enable_routed_experts_transfer``: bool, default False; send/receive R3 route records
  with the KV.
- ``engine_id``: optional non-empty string identifying this instance.
- ``kv_connector_extra_config``: optional JSON object, free-form, read by the connector.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from execstate.engine.pd_config import PDConfig

CONNECTORS: tuple[str, ...] = ("NixlConnector",)
ROLES: tuple[str, ...] = ("kv_producer", "kv_consumer", "kv_both")
FAILURE_POLICIES: tuple[str, ...] = ("fail", "recompute")


@dataclass(frozen=True)
class KVTransferConfig:
    kv_connector: str
    kv_role: str
    kv_load_failure_policy: str = "fail"
    enable_routed_experts_transfer: bool = False
    engine_id: str | None = None
    kv_connector_extra_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _choice("kv_connector", self.kv_connector, CONNECTORS)
        _choice("kv_role", self.kv_role, ROLES)
        _choice("kv_load_failure_policy", self.kv_load_failure_policy, FAILURE_POLICIES)
        if not isinstance(self.enable_routed_experts_transfer, bool):
            raise ValueError(
                "kv-transfer-config key 'enable_routed_experts_transfer' must be true or false, "
                f"got {self.enable_routed_experts_transfer!r}"
            )
        if self.engine_id is not None and (not isinstance(self.engine_id, str) or not self.engine_id):
            raise ValueError(f"kv-transfer-config key 'engine_id' must be a non-empty string, got {self.engine_id!r}")
        extra = self.kv_connector_extra_config
        if extra is not None and not isinstance(extra, dict):
            raise ValueError(
                f"kv-transfer-config key 'kv_connector_extra_config' must be a JSON object, got {extra!r}"
            )

    @property
    def is_producer(self) -> bool:
        """Prefill side: computes KV and hands it off."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """Decode side: loads KV handed off by a producer."""
        return self.kv_role in ("kv_consumer", "kv_both")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KVTransferConfig:
        if not isinstance(d, dict):
            raise ValueError(f"kv-transfer-config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"kv-transfer-config has unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(known))}"
            )
        for key in ("kv_connector", "kv_role"):
            if key not in d:
                raise ValueError(f"kv-transfer-config is missing the required key {key!r}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> KVTransferConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kv-transfer-config is not valid JSON: {exc}") from None
        return cls.from_dict(d)

    def pd_config(self) -> PDConfig:
        """The engine's PD connector configuration (``EngineConfig.kv_transfer``); ValueError for
        a bad key or value, before any model is loaded. Keys read from
        ``kv_connector_extra_config`` (all optional): ``side_channel_host`` / ``side_channel_port``
        (the control channel, default 127.0.0.1 and a free port), ``max_inflight_transfers``
        (default 64: exports pinned on P, loads in flight on D), ``max_transfer_bytes``,
        ``transfer_ttl_s`` (default 60: how long P keeps an export D never released),
        ``transfer_timeout_s``, ``kv_secret`` (the handoff and migration HMAC secret; default
        ``$EXECSTATE_KV_SECRET``), ``kv_secret_previous`` (a list: secrets still accepted during a
        rotation; default ``$EXECSTATE_KV_SECRET_PREVIOUS``, comma-separated),
        ``allowed_prefill_engines`` (engine id -> ``tcp://host:port``: PD KV handoffs only),
        ``max_fenced_blocks`` (default a quarter of the KV pool). Unknown extra keys are rejected.
        """
        extra = dict(self.kv_connector_extra_config or {})
        known = {
            "side_channel_host": "host",
            "side_channel_port": "port",
            "max_inflight_transfers": "max_inflight",
            "max_transfer_bytes": "max_bytes",
            "transfer_ttl_s": "ttl_s",
            "transfer_timeout_s": "timeout_s",
            "kv_secret": "secret",
            "kv_secret_previous": "previous_secrets",
            "allowed_prefill_engines": "allowed_prefill",
            "max_fenced_blocks": "max_fenced_blocks",
        }
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(f"kv_connector_extra_config: unknown key(s) {unknown}; known: {sorted(known)}")
        return PDConfig(
            role=self.kv_role,
            failure_policy=self.kv_load_failure_policy,
            routes_transfer=self.enable_routed_experts_transfer,
            engine_id=self.engine_id,
            **{known[k]: v for k, v in extra.items()},
        )


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"kv-transfer-config key {key!r} must be one of {', '.join(allowed)}; got {value!r}")
