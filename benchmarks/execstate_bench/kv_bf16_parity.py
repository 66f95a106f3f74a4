"""``python -m execstate_bench.kv_bf16_parity``: bf16 attention's parity against transformers.

Teacher-forced logprobs of the same sequences (``--sequences`` of ``--length`` random token ids,
seeded) from transformers in fp32 (the reference) and in bf16 (``model.to(torch.bfloat16)``: every
weight, activation and K/V in bf16, its own SDPA), and from the engine (``LLM.score``: the rows the
engine computes when it generates, bit for bit) in fp32, fp32 + bf16 K/V
(``kv_cache_dtype="bfloat16"``), bf16 arithmetic and bf16 arithmetic + bf16 K/V. Reported per
mode: the mean and max absolute logprob difference from transformers fp32 and from transformers
bf16, over every position. transformers bf16's own distance from its fp32 is the yardstick of
what bf16 costs in the peer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

MODES: dict[str, dict[str, str]] = {
    "execstate fp32": {},
    "execstate fp32 + bf16 K/V": {"kv_cache_dtype": "bfloat16"},
    "execstate bf16 arithmetic": {"dtype": "bfloat16", "compute_dtype": "bfloat16"},
    "execstate bf16 arithmetic + bf16 K/V": {"dtype": "bfloat16", "compute_dtype": "bfloat16",
                                             "kv_cache_dtype": "bfloat16"},
}


def _hf_logprobs(path: Path, seqs: list[list[int]], bf16: bool) -> list[np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if bf16:
        model = model.to(torch.bfloat16)
    out = []
    with torch.inference_mode():
        for s in seqs:
            ids = torch.tensor([s])
            lp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            out.append(lp.gather(1, ids[0, 1:, None])[:, 0].double().numpy())
    return out


def _distance(a: list[np.ndarray], b: list[np.ndarray]) -> dict[str, float]:
    d = np.concatenate([np.abs(x - y) for x, y in zip(a, b, strict=True)])
    return {"mean_abs": float(d.mean()), "max_abs": float(d.max())}


def run(model: str = "smollm2-135m", sequences: int = 4, length: int = 128, seed: int = 0) -> dict[str, Any]:
    from execstate import LLM
    from execstate_bench.models import resolve_bench_model

    path = resolve_bench_model(model)
    vocab = int(json.loads((path / "config.json").read_text())["vocab_size"])
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, length).tolist() for _ in range(sequences)]
    hf32, hf16 = _hf_logprobs(path, seqs, False), _hf_logprobs(path, seqs, True)
    report: dict[str, Any] = {"model": model, "sequences": sequences, "length": length, "seed": seed,
                              "positions": sequences * (length - 1), "modes": {}}
    report["modes"]["transformers bf16"] = {"vs_transformers_fp32": _distance(hf16, hf32)}
    for name, kwargs in MODES.items():
        llm = LLM(str(path), seed=0, **kwargs)
        lps = [np.asarray(llm.score(s).logprobs, dtype=np.float64) for s in seqs]
        report["modes"][name] = {"numerics": llm.engine.provenance.numerics,
                                 "vs_transformers_fp32": _distance(lps, hf32),
                                 "vs_transformers_bf16": _distance(lps, hf16)}
        del llm
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"parity, {report['model']}: {report['sequences']} x {report['length']} random tokens, "
             f"teacher-forced logprobs ({report['positions']} positions)",
             "| mode | numerics | vs transformers fp32: mean / max abs | vs transformers bf16: mean / max abs |",
             "|---|---|---|---|"]
    for name, m in report["modes"].items():
        a = m["vs_transformers_fp32"]
        b = m.get("vs_transformers_bf16")
        rb = f"{b['mean_abs']:.2e} / {b['max_abs']:.2e}" if b else "0"
        ra = f"{a['mean_abs']:.2e} / {a['max_abs']:.2e}"
        lines.append(f"| {name} | {m.get('numerics', 'torch bf16')} | {ra} | {rb} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    report = run(args.model, args.sequences, args.length)
    print(format_table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
