"""Train the end-of-turn probe (``execstate/agent/end_probe.py``) and evaluate it on the voice
bench's recorded turns.

    python -m execstate_bench.end_probe_train [--turns 2400] [--seed 0] [--out FILE] [--eval-only]

Data (``end_probe_text``, seeded): the project's own user turns; positives are whole turns,
negatives the same turns cut at word boundaries. Each is laid out as the agent's speculative step
sees it: a system prompt (one of ``SYSTEMS``, the project's own), sometimes an earlier exchange
(a generated user turn and one of ``REPLIES``), then the user prefix and `` words``, in ChatML (as
the voice bench's server) or the plain transcript format (``AgentConfig``'s default). One
forward pass of the front model (execstate's own, the engine's CPU kernels: the same numerics as
the live step) per turn gives the final hidden state (the final norm applied) at the last token
of the whole turn and of each cut; a cut whose tokens are not a prefix of the whole turn's is
left out (counted).

Fit: L2-regularised logistic regression (Newton's method in float64: deterministic) on the
hidden state, standardised; the regularisation strength is chosen on a held-aside fifth of the
training turns (never on the bench). The weights are stored with the standardisation folded in
(``w``, ``b``: ``p = sigmoid(w . h + b)``), the front model's ``weights_version`` and the fit's
figures as metadata.

Evaluation (``--eval-only`` reads the stored probe): the held-out set is every turn end and
every scored mid-sentence pause of the nine recorded Moonshine runs in ``docs/`` (the words
Moonshine gave, the live end score with the conversation), scored in the bench's own layout (its
system prompt, ChatML, no earlier turns: the runs do not record the replies).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from execstate_bench.end_probe_text import Turn, generate

SYSTEMS = [
    "<|im_start|>system\nYou are a helpful voice assistant. Keep answers short.<|im_end|>",
    "<|im_start|>system\nYou answer spoken questions from a user in a friendly way.<|im_end|>",
    "<|im_start|>system\nA concise assistant that helps with everyday tasks by voice.<|im_end|>",
    "<|im_start|>system\nYou are a kind assistant on a phone call. Reply in one or two sentences.<|im_end|>",
]
PLAIN_SYSTEMS = ["A helpful voice assistant talks with a user.", "The assistant answers the user briefly.",
                 "A friendly assistant on a call with a user."]
REPLIES = ["Sure, I can help with that.", "Okay, done.", "That's a good question. Let me think.",
           "Here is what I found.", "I'm sorry, I didn't catch that.", "Of course. Anything else?",
           "Got it, I'll remind you.", "It depends on a few things, but usually yes."]
CHATML = ("\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
PLAIN = ("\nUser:", "\nAgent:")
# the voice bench's layout (benchmarks/execstate_bench/duplex.py SYSTEM, CHATML): the held-out set only
BENCH_FILES = ["bench_voice_latency_moonshine", "bench_voice_latency_moonshine_wait_curve",
               "bench_voice_latency_moonshine_defaults", "bench_voice_latency_moonshine_context",
               "bench_voice_latency_1206_fixed_audio"]
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "execstate" / "agent" / "end_probe.safetensors"
DOCS = Path(__file__).resolve().parents[2] / "docs"
MODEL = "smollm2-135m"


@dataclass
class Features:
    hidden: np.ndarray  # [n, H] float32: the final hidden state at each example's last token
    mass: np.ndarray  # [n]: the end tokens' probability mass there (top 20 only, as the live score)
    label: np.ndarray  # [n] 0/1
    group: np.ndarray  # [n]: the turn each example comes from
    dropped: int = 0  # cuts whose tokens were not a prefix of the whole turn's


class Front:
    """The front model's forward pass on one token sequence (execstate's engine, CPU kernels)."""

    def __init__(self, model: str = MODEL) -> None:
        from execstate.engine.llm import EngineLLM

        self.llm = EngineLLM(model, seed=0)
        self.engine = self.llm.engine
        tok = self.llm.get_tokenizer()
        assert tok is not None
        self.tok = tok

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=special))

    @property
    def weights_version(self) -> str:
        return self.llm.weights_version

    @torch.inference_mode()
    def hidden(self, ids: list[int]) -> torch.Tensor:
        """``[n, H]`` final hidden states of ``ids`` (one causal pass; scorer.py's attention)."""
        from execstate.model.context import StepContext
        from execstate.model.replay_attention import KernelCausalAttention

        eng = self.engine
        n = len(ids)
        t = torch.tensor(ids, dtype=torch.long)
        with StepContext(torch.arange(n), KernelCausalAttention(n, eng.kv_pool.k.dtype), None) as ctx:
            return eng.model(t, ctx).float()

    def end_mass(self, hidden: torch.Tensor, end_tokens: Sequence[int], top: int = 20) -> np.ndarray:
        """The end tokens' probability among the top ``top`` at each row (``SessionFront.speculate``)."""
        logp = torch.log_softmax(self.engine.model.compute_logits(hidden).float(), dim=-1)
        vals, idx = logp.topk(top, dim=-1)
        ends = torch.tensor(sorted(end_tokens))
        keep = torch.isin(idx, ends)
        return (vals.exp() * keep).sum(-1).numpy()

    def end_tokens(self, agent_prefix: str) -> list[int]:
        return sorted({self.encode(x)[0] for x in (agent_prefix, ".", "?", "!")})


def _context(front: Front, rng: random.Random, fmt: tuple[str, str], chatml: bool, prev: Turn | None) -> list[int]:
    ids = front.encode(rng.choice(SYSTEMS if chatml else PLAIN_SYSTEMS), special=True)
    if prev is not None:
        ids += front.encode(f"{fmt[0]} {' '.join(prev.words)}") + front.encode(fmt[1])
        ids += front.encode(" " + rng.choice(REPLIES))
    return ids


def training_features(front: Front, turns: list[Turn], seed: int, log: bool = True) -> Features:
    """Every whole turn (1) and each of its cuts (0), laid out as the module docstring says."""
    rng = random.Random(seed + 1)
    rows: list[np.ndarray] = []
    masses: list[float] = []
    labels: list[int] = []
    groups: list[int] = []
    dropped = 0
    ends = {True: front.end_tokens(CHATML[1]), False: front.end_tokens(PLAIN[1])}
    t0 = time.monotonic()
    for g, turn in enumerate(turns):
        chatml = rng.random() < 0.7
        fmt = CHATML if chatml else PLAIN
        prev = turns[rng.randrange(len(turns))] if rng.random() < 0.5 else None
        head = _context(front, rng, fmt, chatml, prev)
        full = front.encode(f"{fmt[0]} {' '.join(turn.words)}")
        pos: list[tuple[int, int]] = [(len(head) + len(full) - 1, 1)]
        for k in turn.cuts:
            cut = front.encode(f"{fmt[0]} {' '.join(turn.words[:k]).rstrip('.,')}")
            if full[:len(cut)] != cut:
                dropped += 1
                continue
            pos.append((len(head) + len(cut) - 1, 0))
        h = front.hidden(head + full)
        at = torch.tensor([p for p, _ in pos])
        rows.append(h[at].numpy())
        masses.extend(front.end_mass(h[at], ends[chatml]).tolist())
        labels.extend(lbl for _, lbl in pos)
        groups.extend(g for _ in pos)
        if log and g % 200 == 0:
            print(f"  features: turn {g}/{len(turns)}, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return Features(np.concatenate(rows).astype(np.float32), np.array(masses), np.array(labels),
                    np.array(groups), dropped)


def bench_runs(docs: Path = DOCS) -> list[tuple[str, list[tuple[str, int, float]]]]:
    """Each of the nine runs (its file's name, then "#i" for the i-th run a file holds) with
    (words, label, live end score) of every turn end (1) and scored pause (0) in it."""
    out = []
    for name in BENCH_FILES:
        d = json.loads((docs / f"{name}.json").read_text())
        reports = [r["report"] for r in d["runs"]] if "runs" in d else [d.get("report", d)]
        for i, r in enumerate(reports):
            rows = [(t["text"], 1, t["p_end"]) for t in r["turn_timelines_s"]["real"] if t.get("p_end") is not None]
            rows += [(p["text"], 0, p["p_end"]) for p in r["pause_scores"]["real"] if p.get("p_end") is not None]
            out.append((name + (f"#{i + 1}" if len(reports) > 1 else ""), rows))
    return out


def bench_heldout(docs: Path = DOCS) -> list[tuple[str, int, float]]:
    """(words, label, live end score) of every turn end (1) and scored pause (0) of the nine runs."""
    return [row for _, rows in bench_runs(docs) for row in rows]


def heldout_features(front: Front, items: list[tuple[str, int, float]]) -> Features:
    from execstate_bench.duplex import CHATML as BENCH_CHATML
    from execstate_bench.duplex import SYSTEM

    head = front.encode(SYSTEM, special=True)
    ends = front.end_tokens(BENCH_CHATML["agent_prefix"])
    rows, masses = [], []
    for text, _, _ in items:
        ids = head + front.encode(f"{BENCH_CHATML['user_prefix']} {text}")
        h = front.hidden(ids)[-1:]
        rows.append(h.numpy())
        masses.append(float(front.end_mass(h, ends)[0]))
    return Features(np.concatenate(rows), np.array(masses), np.array([lbl for _, lbl, _ in items]),
                    np.arange(len(items)))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, iters: int = 30) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression (the bias not regularised), Newton's method in float64."""
    x = np.asarray(x, np.float64)
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = np.full(d + 1, l2)
    reg[-1] = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(xb @ w, -30, 30)))
        grad = xb.T @ (p - y) / n + reg * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb / n + np.diag(reg + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w[:-1], float(w[-1])


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counted half."""
    pos, neg = score[label == 1], score[label == 0]
    gt = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(gt / (len(pos) * len(neg)))


# eagerness -> the largest fraction of the held-aside cut turns (negatives) that may score at or
# above its threshold (a pause there would end the turn after the short silence)
CUT_RATES = {"high": 0.10, "medium": 0.05, "low": 0.02}
GRID = [round(0.1 * i, 1) for i in range(1, 10)]


@dataclass(frozen=True)
class Probe:
    w: np.ndarray  # [H] float32, the standardisation folded in
    b: float
    l2: float
    valid_auc: float
    thresholds: dict[str, float]  # eagerness -> threshold, chosen on the held-aside fifth (CUT_RATES)
    valid_rates: dict[str, tuple[float, float]]  # eagerness -> (whole turns, cut turns) at or above it

    def prob(self, hidden: np.ndarray) -> np.ndarray:
        z = np.asarray(hidden, np.float64) @ self.w.astype(np.float64) + self.b
        return 1.0 / (1.0 + np.exp(-z))


def train(feats: Features, seed: int, l2s: Sequence[float] = (1e-4, 1e-3, 1e-2, 1e-1)) -> Probe:
    """Choose the L2 strength on a held-aside fifth of the turns, then fit on all of them."""
    mean, std = feats.hidden.mean(0), feats.hidden.std(0) + 1e-6
    z = (feats.hidden - mean) / std
    groups = np.unique(feats.group)
    rng = np.random.default_rng(seed)
    valid = np.isin(feats.group, rng.choice(groups, size=max(len(groups) // 5, 1), replace=False))
    best = max(l2s, key=lambda l2: auc(_score(z[valid], *fit_logistic(z[~valid], feats.label[~valid], l2)),
                                       feats.label[valid]))
    s = _score(z[valid], *fit_logistic(z[~valid], feats.label[~valid], best))
    yv, pv = feats.label[valid], 1.0 / (1.0 + np.exp(-s))
    vauc = auc(s, yv)
    thresholds = {k: next((t for t in GRID if (pv[yv == 0] >= t).mean() <= rate), GRID[-1])
                  for k, rate in CUT_RATES.items()}
    rates = {k: recall_at(pv, yv, t) for k, t in thresholds.items()}
    w, b = fit_logistic(z, feats.label, best)
    wf = (w / std).astype(np.float32)
    return Probe(wf, float(b - (w * mean / std).sum()), best, vauc, thresholds, rates)


def _score(z: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    return z @ w + b


def save(probe: Probe, path: Path, meta: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    save_file({"w": probe.w, "b": np.array([probe.b], np.float32)}, str(path), metadata=meta)


def recall_at(score: np.ndarray, label: np.ndarray, threshold: float) -> tuple[float, float]:
    """(turn ends at or above ``threshold``, pauses at or above it), as fractions."""
    return float((score[label == 1] >= threshold).mean()), float((score[label == 0] >= threshold).mean())


def evaluate(front: Front, probe_w: np.ndarray, probe_b: float) -> dict[str, object]:
    items = bench_heldout()
    hf = heldout_features(front, items)
    live = np.array([p for _, _, p in items])
    p = 1.0 / (1.0 + np.exp(-(hf.hidden.astype(np.float64) @ probe_w.astype(np.float64) + probe_b)))
    y = hf.label
    out: dict[str, object] = {"n_ends": int(y.sum()), "n_pauses": int((1 - y).sum()),
                              "auc_live_end_score": auc(live, y), "auc_offline_end_mass": auc(hf.mass, y),
                              "auc_probe": auc(p, y), "auc_probe_mean_live": auc(0.5 * (p + live), y)}
    out["at"] = {f"{t}": {"probe": recall_at(p, y, t), "live": recall_at(live, y, t)}
                 for t in (0.2, 0.35, 0.5, 0.7, 0.9)}
    out["pause_max"] = {"probe": float(p[y == 0].max()), "live": float(live[y == 0].max())}
    per_run, i = [], 0
    for name, rows in bench_runs():
        yr, lr, pr = y[i:i + len(rows)], live[i:i + len(rows)], p[i:i + len(rows)]
        i += len(rows)
        per_run.append({"run": name, "ends": int(yr.sum()), "pauses": int((1 - yr).sum()),
                        "auc_live": round(auc(lr, yr), 3), "auc_probe": round(auc(pr, yr), 3),
                        "probe_at_0.5": [int((pr[yr == 1] >= 0.5).sum()), int((pr[yr == 0] >= 0.5).sum())],
                        "live_at_0.35": [int((lr[yr == 1] >= 0.35).sum()), int((lr[yr == 0] >= 0.35).sum())]})
    out["per_run"] = per_run
    out["rows"] = [(t, int(lbl), round(float(s), 4), round(float(q), 4))
                   for (t, lbl, s), q in zip(items, p, strict=True)]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--report", type=Path, default=None, help="write the evaluation as JSON here")
    ap.add_argument("--cache", type=Path, default=None,
                    help="the training features (.npz): read if it exists, else written")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    front = Front()
    t0 = time.monotonic()
    if args.eval_only:
        from safetensors.numpy import load_file

        t = load_file(str(args.out))
        w, b = t["w"], float(t["b"][0])
    else:
        if args.cache is not None and args.cache.exists():
            z = np.load(args.cache)
            feats = Features(z["hidden"], z["mass"], z["label"], z["group"], int(z["dropped"]))
        else:
            feats = training_features(front, generate(args.turns, args.seed), args.seed)
            if args.cache is not None:
                np.savez(args.cache, hidden=feats.hidden, mass=feats.mass, label=feats.label, group=feats.group,
                         dropped=feats.dropped)
        t_feat = time.monotonic() - t0
        probe = train(feats, args.seed)
        meta = {"model": MODEL, "weights_version": front.weights_version, "seed": str(args.seed),
                "turns": str(args.turns), "examples": str(len(feats.label)), "positives": str(int(feats.label.sum())),
                "dropped_cuts": str(feats.dropped), "l2": str(probe.l2), "valid_auc": f"{probe.valid_auc:.4f}",
                "train_auc_end_mass": f"{auc(feats.mass, feats.label):.4f}",
                **{f"threshold_{k}": str(t) for k, t in probe.thresholds.items()},
                **{f"valid_rates_{k}": f"{r[0]:.3f} {r[1]:.3f}" for k, r in probe.valid_rates.items()}}
        save(probe, args.out, meta)
        w, b = probe.w, probe.b
        print(json.dumps({**meta, "features_s": round(t_feat, 1), "fit_s": round(time.monotonic() - t0 - t_feat, 1)}))
    report = evaluate(front, w, b)
    rows = report.pop("rows")
    print(json.dumps(report, indent=1))
    if args.report is not None:
        args.report.write_text(json.dumps({**report, "rows": rows}, indent=1))
    print(f"total {time.monotonic() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

