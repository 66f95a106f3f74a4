"""``execstate serve``'s start-up summary (``execstate.serve.startup_log``): every line's
value, computed here independently from the checkpoint files and the flags; the API key
never appears; ``run_server`` logs the block once, at INFO, before serving."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import torch

from execstate.cli import build_parser
from execstate.engine.engine_facts import summary_of
from execstate.engine.llm_engine import LLMEngine
from execstate.kernels import cpu as cpu_kernels
from execstate.model.random_models import make_random
from execstate.model.weights_digest import model_digest
from execstate.serve import server
from execstate.serve.kv_transfer_config import KVTransferConfig
from execstate.serve.limits import ServingLimits
from execstate.serve.principals import keys_from_args
from execstate.serve.sessions.targets import MigrationTargets
from execstate.serve.startup_log import FIELDS, OPEN_WARNING, StartupInfo, format_startup, startup_lines
from execstate_bench.models import count_parameters

SECRET = "sk-do-not-log-7f3a"


def serve_args(model: Path, *extra: str):
    return build_parser().parse_args(["serve", str(model), *extra])


def lines_of(model: Path, *extra: str, kv: KVTransferConfig | None = None) -> dict[str, str]:
    args = serve_args(model, *extra)
    engine = LLMEngine(server.engine_config_from_args(args))
    return dict(startup_lines(StartupInfo(summary_of(engine), args, kv, 1.25, server.limits_from_args(args),
                                          keys_from_args(args), server.policy_from_args(args),
                                          MigrationTargets.parse(args.migration_targets).describe())))


def test_every_line_of_a_moe_server(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    lines = lines_of(model_dir, "--api-key", SECRET, "--port", "8123", "--served-model-name", "tiny",
                     "--enable-return-routed-experts", "--max-model-len", "64", "--block-size", "8",
                     "--max-num-seqs", "64", "--max-n", "7", "--max-waiting-requests", "33")
    assert list(lines) == [label for label, _ in FIELDS]
    n_params = count_parameters(model_dir)  # oracle: the safetensors headers
    n_layers = cfg["num_hidden_layers"]
    n_moe = sum(1 for i in range(n_layers) if i not in cfg.get("mlp_only_layers", [])
                and (i + 1) % cfg["decoder_sparse_step"] == 0)
    assert n_params < 1e6  # printed in full below 1M
    assert lines["model"] == f"{model_dir} ({model_dir})"
    assert lines["architecture"] == (
        f"Qwen3MoeForCausalLM, {n_params:,} parameters, {n_layers} layers, {n_moe} MoE "
        f"({cfg['num_local_experts']} experts, top-{cfg['num_experts_per_tok']})"
    )
    assert lines["dtype"] == "float32"
    if cpu_kernels.available():
        assert lines["kernels"] == "execstate CPU kernels (cpu-avx2-v2; auto: extension built, AVX2+FMA, cpu, float32)"
    else:
        assert lines["kernels"] == f"torch (auto: {cpu_kernels.unavailable_reason()})"
    assert lines["device"] == f"cpu, {torch.get_num_threads()} threads"
    # 64 sequences (max_num_seqs) x 8 blocks of 8 tokens (max_model_len 64) fit in the 1 GiB default.
    blocks, head_dim = 64 * 8, cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_block = 2 * n_layers * 8 * cfg["num_key_value_heads"] * head_dim * 4
    assert lines["KV cache"] == (
        f"{blocks} blocks x 8 tokens = {blocks * 8:,} tokens, {blocks * per_block / 2**20:,.1f} MiB "
        f"({per_block / 2**20:,.1f} MiB per block)"
    )
    assert lines["max_model_len"] == "64"
    assert lines["max_num_seqs"] == "64"
    assert lines["max_num_batched_tokens"] == "2048"
    assert lines["prefix caching"] == "on"
    assert lines["weights version"] == model_digest(
        LLMEngine(server.engine_config_from_args(serve_args(model_dir))).model
    )
    assert lines["waiting queue"] == "33 requests (429 with Retry-After beyond)"
    limits = ServingLimits(max_n=7, max_waiting_requests=33)
    assert lines["request limits"] == (
        f"--max-n 7, --max-logprobs {limits.max_logprobs}, --max-prompts-per-request {limits.max_prompts_per_request}, "
        f"--max-stop-strings {limits.max_stop_strings}, --max-stop-string-length {limits.max_stop_string_length}, "
        f"--max-stop-token-ids {limits.max_stop_token_ids}, --max-request-bytes {limits.max_request_bytes}, "
        f"--max-logprobs-prompt-tokens {limits.max_logprobs_prompt_tokens}"
    )
    assert lines["R3"] == "on (routed_experts returned)"
    assert lines["PD role"] == "none"
    assert lines["served name"] == "tiny"
    assert lines["listening on"] == "http://127.0.0.1:8123"
    assert lines["API keys"] == "required on every path but /health, the browser pages; tenants: default"
    assert lines["tenancy"] == ("detached sessions expire after 600 s idle; 64 checkpoints per session; per-tenant "
                                "quotas: none")
    assert lines["migration"] == "off (no --migration-targets)"
    trust = lines_of(model_dir, "--session-idle-ttl", "0", "--max-session-checkpoints", "8", "--tenant-max-sessions",
                     "2", "--tenant-max-pinned-blocks", "100", "--migration-targets", "e1=http://h:1,http://h:2")
    assert trust["tenancy"] == ("detached sessions never expire; 8 checkpoints per session; per-tenant "
                                "quotas: sessions 2, pinned blocks 100")
    assert trust["migration"] == "to e1=http://h:1, http://h:2"
    assert lines["sessions"] == ("at most 64 (eviction: none), 64 pending events each; /v1/realtime keeps a dropped "
                                 "connection's sessions 0 s")
    assert lines_of(model_dir, "--max-sessions", "3", "--session-eviction", "lru", "--realtime-grace-s", "2.5")[
        "sessions"] == "at most 3 (eviction: lru), 64 pending events each; /v1/realtime keeps a dropped connection's " \
        "sessions 2.5 s"
    assert lines["start-up"].startswith("1.2 s (engine ") and lines["start-up"].endswith(" s)")
    assert SECRET not in "\n".join(lines.values())


def test_torch_kernels_no_key_and_a_dense_model_without_routes(tmp_path: Path) -> None:
    dense = make_random("llama", tmp_path / "llama", seed=0)
    lines = lines_of(dense, "--kernels", "torch", "--enable-return-routed-experts")
    assert lines["kernels"] == "torch (--kernels torch)"
    assert lines["R3"] == "off (requested, but the model has no MoE layers)"
    assert lines["API keys"] == f"OFF - {OPEN_WARNING}"
    assert lines["served name"] == str(dense)
    assert lines["architecture"] == f"LlamaForCausalLM, {count_parameters(dense):,} parameters, 2 layers"
    bf16 = lines_of(dense, "--dtype", "bf16")
    assert bf16["dtype"] == "bfloat16"
    assert bf16["kernels"] == ("execstate CPU kernels (cpu-avx2-v3-bf16w: bf16 weights, fp32 activations; auto: "
                               "extension built, AVX2+FMA, cpu, bfloat16)" if cpu_kernels.available()
                               else f"torch (auto: {cpu_kernels.unavailable_reason()})")
    assert lines_of(dense)["R3"] == "off"


def test_pd_role_line_names_the_role_and_policy(model_dir: Path) -> None:
    kv = KVTransferConfig.from_dict({"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                     "kv_load_failure_policy": "recompute", "enable_routed_experts_transfer": True})
    lines = lines_of(model_dir, kv=kv)  # no connector attached: only the configured role
    assert lines["PD role"] == "kv_consumer, NixlConnector, failure policy recompute, route records on"


def test_block_is_aligned_and_names_every_field(model_dir: Path) -> None:
    args = serve_args(model_dir)
    text = format_startup(StartupInfo(summary_of(LLMEngine(server.engine_config_from_args(args))), args, None, 0.5))
    head, *rows = text.split("\n")
    assert head == "execstate serve ready"
    assert [r.split("  ")[1].strip() for r in rows] == [label for label, _ in FIELDS]
    width = max(len(label) for label, _ in FIELDS)
    assert all(r[2 + width : 4 + width] == "  " and r[4 + width] != " " for r in rows)


def test_run_server_logs_the_block_once_before_serving(model_dir: Path, monkeypatch, caplog) -> None:
    served = []

    def serve(uvicorn_server, async_engine) -> int:  # instead of running uvicorn
        served.append(uvicorn_server.config)
        return 0

    monkeypatch.setattr(server, "serve_until_engine_dies", serve)
    args = serve_args(model_dir, "--api-key", SECRET, "--port", "8124")
    with caplog.at_level(logging.INFO, logger="execstate.serve.startup"):
        assert server.run_server(args) == 0
    records = [r for r in caplog.records if r.name == "execstate.serve.startup"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    text = records[0].getMessage()
    assert text.startswith("execstate serve ready\n")
    assert re.search(r"\n  listening on +http://127\.0\.0\.1:8124\n", text)
    assert re.search(r"\n  API keys +required on every path but /health, the browser pages; tenants: default\n", text)
    assert SECRET not in text
    assert [(c.host, c.port) for c in served] == [("127.0.0.1", 8124)]


def test_cli_logging_shows_execstate_info_once(capsys) -> None:
    from execstate.logs import setup_cli_logging

    logger = logging.getLogger("execstate")
    before = list(logger.handlers), logger.level
    try:
        setup_cli_logging()
        setup_cli_logging()
        assert sum(getattr(h, "execstate_cli", False) for h in logger.handlers) == 1
        logging.getLogger("execstate.serve.startup").info("hello %s", "there")
        assert capsys.readouterr().err.rstrip().endswith("INFO execstate.serve.startup: hello there")
    finally:
        logger.handlers[:], logger.level = before[0], before[1]


def test_pd_role_line_of_a_producer(model_dir: Path) -> None:
    kv = KVTransferConfig.from_dict({"kv_connector": "NixlConnector", "kv_role": "kv_producer", "engine_id": "p-1"})
    args = serve_args(model_dir)
    engine = LLMEngine(replace(server.engine_config_from_args(args), kv_transfer=kv.pd_config()))
    pd = engine.pd
    assert pd is not None and pd.server is not None
    try:
        line = dict(startup_lines(StartupInfo(summary_of(engine), args, kv, 0.1)))["PD role"]
    finally:
        pd.close()
    assert (
        line
        == "kv_producer, NixlConnector, failure policy fail, route records off, instance p-1, "
        f"control channel {pd.server.addr}"
    )
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", pd.server.addr)


def test_cli_logging_rebinds_a_handler_left_on_an_old_stderr(capsys, monkeypatch) -> None:
    """A handler set up while another stderr was in place (an earlier main() in the same process,
    e.g. under another test's capture) is replaced, not kept writing to the old stream."""
    import io

    from execstate.logs import setup_cli_logging

    logger = logging.getLogger("execstate")
    before = list(logger.handlers), logger.level
    try:
        old = io.StringIO()
        monkeypatch.setattr("sys.stderr", old)
        setup_cli_logging()
        monkeypatch.undo()
        setup_cli_logging()
        assert sum(getattr(h, "execstate_cli", False) for h in logger.handlers) == 1
        logging.getLogger("execstate.serve.startup").info("after %s", "rebinding")
        assert capsys.readouterr().err.rstrip().endswith("INFO execstate.serve.startup: after rebinding")
        assert "after rebinding" not in old.getvalue()
    finally:
        logger.handlers[:], logger.level = before[0], before[1]
