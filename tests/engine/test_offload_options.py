"""The offload options: ``EngineConfig`` checks, ``execstate serve`` flags and their defaults, the
start-up line, and the ``/metrics`` series of each tier."""

from __future__ import annotations

import pytest
from offload_helpers import churn, close, keys_of, make, prompt, run

from execstate.cli import _OFFLOAD_DEFAULTS, build_parser
from execstate.engine.config import EngineConfig
from execstate.engine.engine_facts import load_of, summary_of
from execstate.serve.metrics import ServingMetrics
from execstate.serve.server import engine_config_from_args


@pytest.mark.parametrize("bad, match", [
    ({"offload_dram_bytes": -1}, "offload_dram_bytes"),
    ({"offload_disk_bytes": 1.5}, "offload_disk_bytes"),
    ({"offload_policy": "mru"}, "offload_policy"),
    ({"offload_timeout_s": 0}, "offload_timeout_s"),
    ({"offload_timeout_s": float("inf")}, "offload_timeout_s"),
    ({"offload_redis_url": "http://x"}, "offload_redis_url"),
    ({"offload_dram_bytes": 1 << 20, "enable_prefix_caching": False}, "enable_prefix_caching"),
])
def test_bad_options_are_refused_before_loading(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="does-not-matter", **bad)


def test_serve_flags_map_to_the_engine_config(tmp_path):
    args = build_parser().parse_args([
        "serve", "m", "--offload-dram", "2GiB", "--offload-disk-dir", str(tmp_path), "--offload-disk-bytes", "3GiB",
        "--offload-redis-url", "redis://127.0.0.1:7000/1", "--offload-redis-bytes", "512MiB",
        "--offload-policy", "fifo", "--offload-timeout", "0.25"])
    cfg = engine_config_from_args(args)
    assert (cfg.offload_dram_bytes, cfg.offload_disk_dir, cfg.offload_disk_bytes) == (2 << 30, str(tmp_path), 3 << 30)
    assert (cfg.offload_redis_url, cfg.offload_redis_bytes) == ("redis://127.0.0.1:7000/1", 512 << 20)
    assert (cfg.offload_policy, cfg.offload_timeout_s) == ("fifo", 0.25)
    default = engine_config_from_args(build_parser().parse_args(["serve", "m"]))
    ref = EngineConfig(model="m")
    for name in ("offload_dram_bytes", "offload_disk_dir", "offload_disk_bytes", "offload_redis_url",
                 "offload_redis_bytes", "offload_policy", "offload_timeout_s"):
        assert getattr(default, name) == getattr(ref, name), name
    assert {k: getattr(ref, k) for k in _OFFLOAD_DEFAULTS} == _OFFLOAD_DEFAULTS
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--offload-timeout", "0"])


def test_metrics_show_each_tier(moe_dir, tmp_path):
    llm = make(moe_dir, offload_dram_bytes=64 << 20, offload_disk_dir=str(tmp_path / "d"))
    try:
        a = prompt(40)
        run(llm, a)
        churn(llm, keys_of(llm, a))
        run(llm, a)
        m = ServingMetrics()
        m.set_engine_stats(load_of(llm.engine), True)
        text = m.render().decode()
    finally:
        close(llm)
    lines = {
        ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines() if ln.startswith("execstate_offload")
    }
    assert lines['execstate_offload_reloaded_units_total{tier="dram"}'] == 6
    assert lines['execstate_offload_reloaded_units_total{tier="disk"}'] == 0
    assert lines['execstate_offload_hits_total{tier="dram"}'] == 6
    assert lines['execstate_offload_write_backs_total{tier="disk"}'] >= 6
    assert lines['execstate_offload_tier_available{tier="disk"}'] == 1
    assert lines['execstate_offload_tier_units{tier="dram"}'] >= 6
    assert lines['execstate_offload_tier_bytes{tier="dram"}'] == \
        lines['execstate_offload_tier_units{tier="dram"}'] * llm.engine.kv_pool.unit_nbytes()
    assert lines['execstate_offload_reload_seconds_count{tier="dram"}'] == 1
    assert lines['execstate_offload_reload_seconds_bucket{le="+Inf",tier="dram"}'] == 1
    assert 'execstate_offload_checksum_failures_total' not in lines  # none yet: the family has no sample


def test_startup_line(moe_dir, tmp_path):
    from types import SimpleNamespace

    from execstate.serve.startup_log import offload_line

    llm = make(moe_dir, offload_dram_bytes=1 << 30, offload_redis_url="redis://user:pw@127.0.0.1:1/0",
               offload_timeout_s=0.5, offload_secret="startup-line-shared-secret-0123")
    try:
        line = offload_line(SimpleNamespace(engine=summary_of(llm.engine)))
    finally:
        close(llm)
    assert line.startswith("dram 1.0 GiB, redis 4.0 GiB") and "redis redis://127.0.0.1:1/0" in line
    assert "pw" not in line and "policy lru, timeout 0.5 s" in line and "units signed with the shared secret" in line
    assert offload_line(SimpleNamespace(engine=summary_of(make(moe_dir).engine))) == "off"
