"""lm-evaluation-harness's ``local-completions`` model drives a real server on a task defined in the
repository (local data, no hub); every log-likelihood it computes equals ``LLM.score``'s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from execstate.engine.async_engine import AsyncEngine
from execstate.engine.scorer import score_tokens
from execstate.model.random_models import make_random
from execstate.model.random_tokenizer import write_tokenizer
from execstate.serve.app import build_app
from execstate.session.lm.llm import LLM
from execstate_bench.harness import DATA, TASK, run_harness, write_task

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
from serve_helpers import running_server  # noqa: E402


def test_task_yaml_names_the_shipped_data(tmp_path):
    text = write_task(tmp_path).read_text()
    assert f"task: {TASK}" in text and str(DATA.resolve()) in text and DATA.exists()
    assert sum(1 for _ in DATA.open()) == 20


@pytest.mark.slow
def test_harness_loglikelihoods_equal_llm_score(tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is a bench-only install: pip install -e 'benchmarks[eval]'")
    d = make_random("llama", tmp_path / "m", seed=0)
    write_tokenizer(Path(d))
    llm = LLM(str(d), seed=0)
    engine = AsyncEngine(llm.engine)
    try:
        with running_server(build_app(engine, "tiny")) as (url, _):
            run = run_harness(url, "tiny", lambda ids: engine.call(lambda e: score_tokens(e, ids)), limit=6)
    finally:
        engine.shutdown()
    assert run.num_pairs == 24 and run.num_equal == run.num_pairs and run.max_abs_diff == 0.0
    assert 0.0 <= run.accuracy <= 1.0
