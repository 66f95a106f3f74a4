"""``execstate bench builds``: builds of the C extension against each other in one process.

Why: on the shared 2-vCPU host the same build's warm 8 x 256 fp32 prefill moved from 246.8 to
267.2 ms (min of 8) within three minutes of a quiet slot, while an FMA loop in L1 held 271-276
GFLOP/s: the drift is the host's shared cache and memory, not the clock. Fresh processes
alternated a minute apart cannot resolve a 1-2 % change under that drift; calls interleaved
within one process, a fraction of a second apart, can. Each ``--build`` (a ``_cpu*.so`` file,
e.g. a copy of ``execstate/kernels/_cpu*.so`` from another checkout) is loaded as its own module
(a distinct package name, so the dynamic loader maps each file apart); the first is the
baseline.

Workloads:

- ``moe``: the fp32 packed MoE (``moe_packed``) of the standard model's shape (8 experts, top 2,
  hidden 512, expert width 768) on ``tokens`` tokens with random routing. Every build's output
  must equal the baseline's bit for bit, else ``BuildMismatch`` (a kernel change must keep the
  numerics; a build that does not is not a speed result).
- ``prefill``: a warm 8 x ``prompt_len`` (256) fp32 prefill of the standard model (fresh prompts
  each call, no prefix cache), the engine's extension module
  (``execstate.kernels.ext._cpu``) swapped for each build in turn. Every kernel the model reaches
  through ``ext.lib()`` at call time takes the build; the greedy tokens of every build must equal
  the baseline's.

Each round runs every build in turn (``calls`` calls each, the fastest kept); the report gives
per build the median and min over rounds and the median over rounds of its time over the
baseline's in the same round (``paired_ratio``: below 1 is faster). With ``control`` (the
default) a copy of the baseline runs last as an A/A control: its ratio is what the same code
differs by in this run, the noise a build's ratio has to stand out from (measured here: 0.994
and 1.001 over 20 prefill rounds, while one MoE change came out 0.978 in a prefill run of 10
rounds and 1.022 in one of 12).
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

MOE_SHAPE = {"k": 2, "experts": 8, "hidden": 512, "expert_width": 768}


class BuildMismatch(RuntimeError):
    """A build's results differ from the baseline's."""


def load_build(path: Path, index: int) -> ModuleType:
    """The extension file at ``path`` as its own module (``execstate_build_<index>._cpu``)."""
    if not path.is_file():
        raise FileNotFoundError(f"no extension build at {path}")
    spec = importlib.util.spec_from_file_location(f"execstate_build_{index}._cpu", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "moe_packed"):
        raise ValueError(f"{path} is not an execstate kernels build (no moe_packed)")
    return module


def _check(builds: Sequence[Path], rounds: int, calls: int) -> None:
    if len(builds) < 2:
        raise ValueError("give at least two builds (the first is the baseline)")
    if rounds < 1 or calls < 1:
        raise ValueError(f"rounds and calls must be >= 1, got {rounds} and {calls}")
    for p in builds:
        if not p.is_file():
            raise FileNotFoundError(f"no extension build at {p}")


def _load_all(builds: Sequence[Path], control: bool, tmp: Path) -> tuple[list[ModuleType], list[str]]:
    """The builds as modules and their names; with ``control`` a copy of the first last (a file of
    its own, so the loader maps it apart: its own code and statics, as every other build)."""
    paths = list(builds)
    names = [str(p) for p in builds]
    if control:
        (tmp / "control").mkdir()
        paths.append(Path(shutil.copy(builds[0], tmp / "control" / builds[0].name)))
        names.append(f"{builds[0]} (A/A control)")
    return [load_build(p, i) for i, p in enumerate(paths)], names


def _rounds(run: Callable[[int], float], n_builds: int, rounds: int, calls: int) -> list[list[float]]:
    """Per build, per round: the fastest of ``calls`` timed ``run(build)`` calls."""
    times: list[list[float]] = [[] for _ in range(n_builds)]
    for _ in range(rounds):
        for b in range(n_builds):
            times[b].append(min(run(b) for _ in range(calls)))
    return times


def summarize(names: Sequence[str], times: Sequence[Sequence[float]],
              flop: float | None = None) -> list[dict[str, Any]]:
    """Per build: median and min seconds over rounds, and the median of its per-round time over
    the baseline's (the first build's) in the same round."""
    out = []
    for name, ts in zip(names, times, strict=True):
        row: dict[str, Any] = {
            "build": name, "median_s": statistics.median(ts), "min_s": min(ts),
            "paired_ratio": statistics.median(a / b for a, b in zip(ts, times[0], strict=True)),
        }
        if flop:
            row["gflops"] = flop / row["median_s"] / 1e9
        out.append(row)
    return out


def run_moe_ab(builds: Sequence[Path], tokens: int = 2048, rounds: int = 30, calls: int = 4, control: bool = True,
               seed: int = 0) -> dict[str, Any]:
    """The ``moe`` workload (module docstring)."""
    _check(builds, rounds, calls)
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    with tempfile.TemporaryDirectory() as tmp:
        mods, names = _load_all(builds, control, Path(tmp))
        return _moe_ab(mods, names, tokens, rounds, calls, seed)


def _moe_ab(mods: list[ModuleType], names: list[str], tokens: int, rounds: int, calls: int,
            seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    k, e, h, i = (MOE_SHAPE[n] for n in ("k", "experts", "hidden", "expert_width"))
    x = torch.randn(tokens, h, generator=g)
    wts, ids = torch.topk(torch.softmax(torch.randn(tokens, e, generator=g), -1), k)
    ids, wts = ids.contiguous(), wts.contiguous()
    w_gu = torch.randn(e, 2 * i, h, generator=g) * 0.05
    w_d = torch.randn(e, h, i, generator=g) * 0.05
    outs = [torch.empty(tokens, h) for _ in mods]

    def run(b: int) -> float:
        t0 = time.perf_counter()
        mods[b].moe_packed(x.data_ptr(), ids.data_ptr(), wts.data_ptr(), w_gu.data_ptr(), w_d.data_ptr(),
                           outs[b].data_ptr(), tokens, k, e, h, i)
        return time.perf_counter() - t0

    for b in range(len(mods)):
        run(b)
        if not torch.equal(outs[b], outs[0]):
            raise BuildMismatch(f"{names[b]}: moe_packed's output differs from {names[0]}'s")
    times = _rounds(run, len(mods), rounds, calls)
    flop = 2.0 * tokens * k * 3 * h * i
    return {"workload": "moe", "tokens": tokens, "rounds": rounds, "calls": calls, "shape": MOE_SHAPE,
            "threads": torch.get_num_threads(), "builds": summarize(names, times, flop)}


def run_prefill_ab(builds: Sequence[Path], model_path: Path, rounds: int = 10, calls: int = 3,
                   prompt_len: int = 256, control: bool = True, seed: int = 0) -> dict[str, Any]:
    """The ``prefill`` workload (module docstring)."""
    _check(builds, rounds, calls)
    with tempfile.TemporaryDirectory() as tmp:
        mods, names = _load_all(builds, control, Path(tmp))
        return _prefill_ab(mods, names, model_path, rounds, calls, prompt_len, seed)


def _prefill_ab(mods: list[ModuleType], names: list[str], model_path: Path, rounds: int, calls: int,
                prompt_len: int, seed: int) -> dict[str, Any]:
    from execstate import LLM, SamplingParams
    from execstate.kernels import ext

    # no prefix cache: the builds' first calls share prompts, and each must compute all of them
    llm = LLM(str(model_path), block_size=16, enable_prefix_caching=False, enable_return_routed_experts=False,
              seed=0, max_model_len=None, max_num_batched_tokens=2048, max_num_seqs=64, prefault_kv=True)
    if llm.engine.kv_populate is not None:
        llm.engine.kv_populate.join()
    rng = random.Random(seed)
    vocab = llm.engine.model_config.vocab_size
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def prompts() -> list[dict[str, list[int]]]:
        return [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(prompt_len)]} for _ in range(8)]

    original = ext._cpu
    try:
        same = prompts()
        firsts = []
        for m in mods:
            ext._cpu = m
            firsts.append([o.outputs[0].token_ids[0] for o in llm.generate(same, sp, use_tqdm=False)])
            llm.generate(prompts(), sp, use_tqdm=False)
        for b, f in enumerate(firsts):
            if f != firsts[0]:
                raise BuildMismatch(f"{names[b]}: greedy tokens {f} differ from {names[0]}'s {firsts[0]}")

        def run(b: int) -> float:
            ext._cpu = mods[b]
            p = prompts()
            t0 = time.perf_counter()
            llm.generate(p, sp, use_tqdm=False)
            return time.perf_counter() - t0

        times = _rounds(run, len(mods), rounds, calls)
    finally:
        ext._cpu = original
    return {"workload": "prefill", "prompts": f"8 x {prompt_len}", "rounds": rounds, "calls": calls,
            "builds": summarize(names, times)}


def format_build_table(report: dict[str, Any]) -> str:
    lines = [f"builds A/B, workload {report['workload']}, {report['rounds']} rounds of {report['calls']} calls "
             f"(fastest kept); paired ratio: per round against the first build, median"]
    for r in report["builds"]:
        extra = f"  {r['gflops']:.0f} GFLOP/s" if "gflops" in r else ""
        lines.append(f"  {r['build']}: median {r['median_s'] * 1e3:.2f} ms  min {r['min_s'] * 1e3:.2f} ms{extra}  "
                     f"paired ratio {r['paired_ratio']:.3f}")
    return "\n".join(lines)
