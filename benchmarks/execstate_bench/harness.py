"""lm-evaluation-harness drives an execstate server, and its log-likelihoods equal ``LLM.score``.

The harness's ``local-completions`` model scores each (context, continuation) pair with one
``/v1/completions`` request (``echo: true, logprobs: 1, max_tokens: 1`` over the pair's token
ids) and sums the continuation's ``token_logprobs``; its tokenizer is the server's own
(``/tokenizer_info``, ``/tokenize``, ``/detokenize``: nothing is downloaded). The task,
``execstate_cloze``, is defined here with the data shipped in the package
(``execstate_bench/data/cloze.jsonl``: 20 four-way cloze questions; no hub). ``run_harness`` runs it and
checks every log-likelihood against ``LLM.score`` on the same tokens (the server scores the
prompt with the same forward pass, so they are equal bit for bit).

lm-eval is not a dependency (it brings about 40 packages: datasets, pandas, pyarrow, scikit-learn,
nltk...): ``pip install -e '.[eval]'``. Run: ``python -m execstate_bench.harness --model smollm2-135m``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "cloze.jsonl"
TASK = "execstate_cloze"
_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


@dataclass(frozen=True)
class HarnessRun:
    accuracy: float
    num_pairs: int  # (context, continuation) log-likelihoods the harness asked for
    max_abs_diff: float  # the largest |harness - LLM.score| over them
    num_equal: int  # how many were equal bit for bit


def write_task(directory: Path) -> Path:
    """The task's YAML in ``directory`` (it names the shipped data by absolute path)."""
    path = directory / f"{TASK}.yaml"
    path.write_text(_YAML.format(task=TASK, data=json.dumps(str(DATA.resolve()))))
    return path


def run_harness(base_url: str, model_name: str, score: Any, limit: int | None = None) -> HarnessRun:
    """Run the task against the server at ``base_url`` and compare with ``score`` (``LLM.score``)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(base_url=f"{base_url}/v1/completions", model=model_name, tokenizer_backend="remote",
                             tokenized_requests=True, num_concurrent=1, max_retries=1)
    with tempfile.TemporaryDirectory() as d:
        write_task(Path(d))
        out = simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=d), limit=limit,
                              log_samples=True, bootstrap_iters=0)
    assert out is not None
    diffs = []
    for sample in out["samples"][TASK]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"], strict=True):
            ctx_ids, cont_ids = lm._encode_pair(context, continuation)
            want = sum(score(ctx_ids + cont_ids).logprobs[len(ctx_ids) - 1:])
            diffs.append(abs(resp[0][0] - want))
    return HarnessRun(out["results"][TASK]["acc,none"], len(diffs), max(diffs, default=0.0),
                      sum(d == 0.0 for d in diffs))


def main(argv: list[str] | None = None) -> None:
    import threading
    import time

    import uvicorn

    from execstate.engine.async_engine import AsyncEngine
    from execstate.help_text import plain
    from execstate.serve.app import build_app
    from execstate.session.lm.llm import LLM

    ap = argparse.ArgumentParser(description=plain(__doc__.splitlines()[0]))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args(argv)
    llm = LLM(args.model)
    engine = AsyncEngine(llm.engine)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, args.model), host="127.0.0.1", port=args.port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    try:
        # LLM.score, on the engine thread (the engine is serving)
        run = run_harness(f"http://127.0.0.1:{args.port}", args.model,
                          engine.score_blocking, args.limit)
        print(json.dumps(run.__dict__, indent=2))
    finally:
        server.should_exit = True
        engine.shutdown()


if __name__ == "__main__":
    main()
