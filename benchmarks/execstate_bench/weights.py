"""``execstate bench weights``: how long a weight update takes, with and without a supplied version.

One engine on ``model`` (default the embedded ``smollm2-moe``); each case runs ``repeats``
updates and reports the median wall time of ``LLMEngine.update_weights`` (nothing in
flight, so the policy does not matter):

- ``state_dict+hash`` / ``state_dict+version``: from an in-memory HF state dict (read
  and materialised once), the weights version hashed (the default) or supplied by the
  caller (no hash);
- ``path+hash`` / ``path+version``: from the checkpoint directory (safetensors mapped and
  read each time; the OS page cache is warm after the first);
- ``previous (reallocate+hash)``: what ``update_weights`` did before in-place updates
  (``load_hf_weights``: fresh tensors for every parameter, then the digest), run last
  because it replaces the engine's parameters.

The breakdown times the parts on the same state dict: validation (``plan_weight_copy``),
the in-place copy (``WeightCopyPlan.apply``, with its bandwidth) and the digest
(``model_digest``). Every update is checked to leave every parameter's ``data_ptr``
unchanged (``in_place``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.model.loader import load_hf_state_dict, load_hf_weights
from execstate.model.weight_copy import plan_weight_copy
from execstate.model.weights_digest import model_digest


def _median(fn: Callable[[int], Any], repeats: int) -> dict[str, Any]:
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "seconds": times}


def run_weights_bench(model: str = "smollm2-moe", repeats: int = 5, threads: int | None = None,
                      print_table: bool = True) -> dict[str, Any]:
    if threads is not None:
        torch.set_num_threads(threads)
    engine = LLMEngine(EngineConfig(model=model))
    path: Path = engine.model_path
    t = time.perf_counter()  # in memory, as a trainer holds it (safetensors maps the file lazily)
    state_dict = {name: tensor.clone() for name, tensor in load_hf_state_dict(path).items()}
    read_s = time.perf_counter() - t
    params = dict(engine.model.named_parameters())
    ptrs = {n: p.data_ptr() for n, p in params.items()}
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())

    def in_place() -> bool:
        return {n: p.data_ptr() for n, p in engine.model.named_parameters()} == ptrs

    cases: dict[str, dict[str, Any]] = {}
    runs: list[tuple[str, Callable[[int], Any]]] = [
        ("state_dict+hash", lambda i: engine.update_weights(state_dict)),
        ("state_dict+version", lambda i: engine.update_weights(state_dict, weights_version=f"sd-{i}")),
        ("path+hash", lambda i: engine.update_weights(path)),
        ("path+version", lambda i: engine.update_weights(path, weights_version=f"path-{i}")),
    ]
    for name, fn in runs:
        cases[name] = _median(fn, repeats)
        cases[name]["in_place"] = in_place()
    plan = plan_weight_copy(engine.model, state_dict)
    breakdown = {
        "validate": _median(lambda i: plan_weight_copy(engine.model, state_dict), repeats),
        "copy": _median(lambda i: plan.apply(), repeats),
        "digest": _median(lambda i: model_digest(engine.model), repeats),
    }
    breakdown["copy"]["gb_per_s"] = plan.num_bytes / breakdown["copy"]["median_s"] / 1e9

    def previous(i: int) -> None:
        load_hf_weights(engine.model, state_dict)
        model_digest(engine.model)

    cases["previous (reallocate+hash)"] = _median(previous, repeats)
    report = {
        "model": str(model),
        "param_bytes": param_bytes,
        "num_params": sum(p.numel() for p in params.values()),
        "dtype": engine.config.dtype,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "read_state_dict_s": read_s,
        "cases": cases,
        "breakdown": breakdown,
    }
    if print_table:
        print(format_weights_table(report))
    return report


def format_weights_table(report: dict[str, Any]) -> str:
    gb = report["param_bytes"] / 1e9
    lines = [f"weight update, {report['model']}: {report['num_params'] / 1e6:.0f}M params, {gb:.2f} GB "
             f"{report['dtype']}, {report['threads']} threads, median of {report['repeats']}",
             f"{'case':<28}{'median s':>10}{'min s':>8}  in place"]
    for name, c in report["cases"].items():
        lines.append(f"{name:<28}{c['median_s']:>10.3f}{c['min_s']:>8.3f}  {c.get('in_place', '-')}")
    b = report["breakdown"]
    lines.append(f"breakdown: validate {b['validate']['median_s']:.3f} s, copy {b['copy']['median_s']:.3f} s "
                 f"({b['copy']['gb_per_s']:.1f} GB/s), digest {b['digest']['median_s']:.3f} s; "
                 f"reading the checkpoint into memory once: {report['read_state_dict_s']:.3f} s")
    return "\n".join(lines)
