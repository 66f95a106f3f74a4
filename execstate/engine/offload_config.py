"""The offload options of ``EngineConfig`` (``offload_*``): their checks and what they enable.

Offload is on when any tier is configured: ``offload_dram_bytes > 0``, ``offload_disk_dir`` or
``offload_redis_url``. It needs the prefix cache (units are cached blocks). Bad values are a
``ValueError`` naming the option, before any model is loaded.
"""

from __future__ import annotations

import math
from typing import Protocol

from execstate.state.tiers.store import POLICIES


class _OffloadOptions(Protocol):
    enable_prefix_caching: bool
    offload_dram_bytes: int
    offload_disk_dir: str | None
    offload_disk_bytes: int
    offload_redis_url: str | None
    offload_redis_bytes: int
    offload_policy: str
    offload_timeout_s: float


def offload_enabled(cfg: _OffloadOptions) -> bool:
    return cfg.offload_dram_bytes > 0 or cfg.offload_disk_dir is not None or cfg.offload_redis_url is not None


def validate_offload(cfg: _OffloadOptions) -> None:
    for name in ("offload_dram_bytes", "offload_disk_bytes", "offload_redis_bytes"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0 (bytes), got {v!r}")
    if cfg.offload_policy not in POLICIES:
        raise ValueError(f"offload_policy must be one of {POLICIES}, got {cfg.offload_policy!r}")
    t = cfg.offload_timeout_s
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"offload_timeout_s must be a finite number of seconds > 0, got {t!r}")
    if cfg.offload_disk_dir is not None and not str(cfg.offload_disk_dir):
        raise ValueError("offload_disk_dir must be a directory path")
    if cfg.offload_redis_url is not None and not str(cfg.offload_redis_url).startswith(
            ("redis://", "rediss://", "unix://")):
        raise ValueError(f"offload_redis_url must be a redis://, rediss:// or unix:// URL, got "
                         f"{cfg.offload_redis_url!r}")
    if offload_enabled(cfg) and not cfg.enable_prefix_caching:
        raise ValueError("offload tiers need enable_prefix_caching (the units they keep are cached blocks)")
