"""``execstate serve --agent-back-model``: a second engine serves the agents' back-end model (the
tool ``reason``), named in the start-up log; without it the served model is the back end."""

from __future__ import annotations

import logging
from pathlib import Path

from execstate.cli import build_parser
from execstate.engine.engine_facts import summary_of
from execstate.engine.llm_engine import LLMEngine
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer
from execstate.serve import server
from execstate.serve.startup_log import StartupInfo, startup_lines


def serve_args(*extra: str):
    return build_parser().parse_args(["serve", *extra])


def test_agents_line(model_dir: Path) -> None:
    args = serve_args(str(model_dir))
    assert args.agent_back_model is None
    engine = LLMEngine(server.engine_config_from_args(args))
    line = dict(startup_lines(StartupInfo(summary_of(engine), args, None, 0.1)))["agents"]
    assert line == ("/v1/realtime/agent: front = the served model; back-end model (tool 'reason') = the served "
                    "model, batch priority; server tools calculator, lookup")
    args = serve_args(str(model_dir), "--agent-back-model", "/models/back")
    line = dict(startup_lines(StartupInfo(summary_of(engine), args, None, 0.1)))["agents"]
    assert "back-end model (tool 'reason') = /models/back;" in line


def test_run_server_builds_the_back_engine_and_shuts_both_down(model_dir: Path, tmp_path: Path, monkeypatch,
                                                                 caplog) -> None:
    back_dir = make_random("llama", tmp_path / "back", seed=1)
    write_tokenizer(back_dir)
    seen = {}

    def serve(uvicorn_server, async_engine) -> int:  # instead of running uvicorn
        agent = uvicorn_server.config.app.state.agent
        seen["front"], seen["back"] = async_engine, agent.back_engine
        seen["tools"] = agent.tools.names
        return 0

    monkeypatch.setattr(server, "serve_until_engine_dies", serve)
    with caplog.at_level(logging.INFO, logger="execstate.serve.startup"):
        assert server.run_server(serve_args(str(model_dir), "--agent-back-model", str(back_dir))) == 0
    assert seen["back"] is not seen["front"] and seen["back"].model_path == back_dir
    assert seen["tools"] == ["calculator", "lookup", "reason"]
    assert not seen["back"].is_healthy and not seen["front"].is_healthy  # both shut down
    assert f"back-end model (tool 'reason') = {back_dir};" in caplog.text
