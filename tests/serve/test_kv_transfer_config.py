"""--kv-transfer-config parsing (vLLM key names) and the serve CLI's start-up order."""

from __future__ import annotations

import json

import pytest

from execstate.cli import build_parser
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.server import engine_config_from_args, run_server

FULL = {
    "kv_connector": "NixlConnector",
    "kv_role": "kv_consumer",
    "kv_load_failure_policy": "recompute",
    "enable_routed_experts_transfer": True,
    "engine_id": "decode-0",
    "kv_connector_extra_config": {"backends": ["UCX"], "num_threads": 4},
}


def test_every_key_parsed():
    cfg = KVTransferConfig.from_json(json.dumps(FULL))
    assert cfg == KVTransferConfig(**FULL)
    assert (cfg.kv_connector, cfg.kv_role, cfg.kv_load_failure_policy) == ("NixlConnector", "kv_consumer", "recompute")
    assert cfg.enable_routed_experts_transfer is True and cfg.engine_id == "decode-0"
    assert cfg.kv_connector_extra_config == {"backends": ["UCX"], "num_threads": 4}
    assert cfg.is_consumer and not cfg.is_producer
    with pytest.raises(AttributeError):
        cfg.kv_role = "kv_producer"  # frozen


def test_defaults_and_roles():
    cfg = KVTransferConfig.from_json('{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}')
    assert cfg.kv_load_failure_policy == "fail" and cfg.enable_routed_experts_transfer is False
    assert cfg.engine_id is None and cfg.kv_connector_extra_config is None
    assert cfg.is_producer and not cfg.is_consumer
    both = KVTransferConfig.from_dict({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    assert both.is_producer and both.is_consumer


@pytest.mark.parametrize("key", ["kv_buffer_size", "kv_rank", "enable_routed_expert_transfer"])
def test_unknown_key_rejected_by_name(key):
    with pytest.raises(ValueError, match=f"unknown key '{key}'"):
        KVTransferConfig.from_dict({**FULL, key: 1})


@pytest.mark.parametrize("key", ["kv_connector", "kv_role"])
def test_required_keys(key):
    d = {k: v for k, v in FULL.items() if k != key}
    with pytest.raises(ValueError, match=f"missing the required key '{key}'"):
        KVTransferConfig.from_dict(d)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("kv_connector", "LMCacheConnectorV1"),
        ("kv_connector", None),
        ("kv_role", "kv_decoder"),
        ("kv_load_failure_policy", "retry"),
        ("enable_routed_experts_transfer", "true"),
        ("enable_routed_experts_transfer", 1),
        ("engine_id", ""),
        ("engine_id", 7),
        ("kv_connector_extra_config", ["not", "a", "dict"]),
    ],
)
def test_bad_values_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"'{key}'"):
        KVTransferConfig.from_dict({**FULL, key: value})


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"NixlConnector"'])
def test_not_a_json_object(text):
    with pytest.raises(ValueError, match="kv-transfer-config"):
        KVTransferConfig.from_json(text)


def test_serve_cli_arguments():
    args = build_parser().parse_args([
        "serve", "/m", "--port", "9001", "--host", "0.0.0.0", "--api-key", "k", "--enable-return-routed-experts",
        "--kv-transfer-config", json.dumps(FULL), "--served-model-name", "moe", "--dtype", "bfloat16",
        "--max-model-len", "128", "--block-size", "8", "--seed", "3", "--kernels", "torch",
    ])
    assert (args.cmd, args.model, args.port, args.host, args.api_key) == ("serve", "/m", 9001, "0.0.0.0", ["k"])
    assert (
        args.served_model_name == "moe" and KVTransferConfig.from_json(args.kv_transfer_config).engine_id == "decode-0"
    )
    cfg = engine_config_from_args(args)
    assert (cfg.dtype, cfg.max_model_len, cfg.block_size, cfg.seed, cfg.kernels) == ("bfloat16", 128, 8, 3, "torch")
    assert cfg.enable_return_routed_experts is True
    defaults = build_parser().parse_args(["serve", "/m"])
    assert (defaults.port, defaults.host, defaults.api_key, defaults.kv_transfer_config) == (
        8000,
        "127.0.0.1",
        None,
        None,
    )
    assert engine_config_from_args(defaults).kernels == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--kernels", "fast"])


def test_bad_config_fails_before_loading_the_model(tmp_path):
    args = build_parser().parse_args(["serve", str(tmp_path / "missing"), "--kv-transfer-config", '{"kv_rank": 0}'])
    with pytest.raises(ValueError, match="kv_rank"):
        run_server(args)


def test_pd_config_builds_the_connector_and_rejects_unknown_extra_keys(model_dir):
    from execstate.engine.async_engine import AsyncEngine
    from execstate.engine.config import EngineConfig

    def config(kv: KVTransferConfig) -> EngineConfig:
        return EngineConfig(model=str(model_dir), enable_return_routed_experts=True, kv_transfer=kv.pd_config())

    bad = KVTransferConfig.from_dict(
        {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"sid": 1}}
    )
    with pytest.raises(ValueError, match="unknown key"):
        bad.pd_config()
    # fault injection is reachable only from tests (a test double), never from the config
    faulty = KVTransferConfig.from_dict({"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                         "kv_connector_extra_config": {"fault_injection": {"mode": "corrupt"}}})
    with pytest.raises(ValueError, match="unknown key.*fault_injection"):
        faulty.pd_config()
    short = KVTransferConfig.from_dict({"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                        "kv_connector_extra_config": {"kv_secret": "short"}})
    with pytest.raises(ValueError, match="at least 16 bytes"):
        AsyncEngine.from_config(config(short))
    cfg = KVTransferConfig.from_dict(
        {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "enable_routed_experts_transfer": True,
            "engine_id": "unit-test",
            "kv_connector_extra_config": {
                "transfer_ttl_s": 3.0, "max_inflight_transfers": 2, "kv_secret": "unit-test-secret-0123456789",
                "allowed_prefill_engines": {"p9": "tcp://10.1.2.3:5600"}, "max_fenced_blocks": 8,
            },
        }
    )
    ae = AsyncEngine.from_config(config(cfg))
    try:
        trust = ae.handoff_trust
        assert trust is not None and trust.secret.current == b"unit-test-secret-0123456789"
        assert trust.allowed == {"p9": "tcp://10.1.2.3:5600"}
        pd = ae.call(lambda e: e.pd)
        assert ae.call(lambda e: e.scheduler.external) is pd.loads
        assert pd.loads.max_fenced_blocks == 8 and pd.loads.max_inflight == 2
        assert pd.instance_id == "unit-test" and pd.cfg.failure_policy == "recompute"
        assert pd.exporter is not None and pd.importer is not None
        assert pd.exporter.max_inflight == 2 and pd.exporter.ttl_s == 3.0
        assert pd.capabilities().r3 is not None
        ae.call(lambda e: e.pd.close())
    finally:
        ae.shutdown()
