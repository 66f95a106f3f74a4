"""``execstate bench offload``: the offload tiers' benchmark (docs/offload.md "Numbers").

Parts (``--parts``, comma-separated):

- ``chat`` (``execstate_bench/offload_chat.py``): a multi-tenant chat workload whose working set is 4x the
  pool; TTFT p50 / p99 and prefill tokens computed with no tier / DRAM / DRAM+disk / +Redis.
  Goal: TTFT p50 at least 3x lower than with no tier.
- ``reload`` (``execstate_bench/offload_reload.py``): reload from DRAM, disk and Redis vs recompute at
  1k / 4k / 16k tokens. Goals at 4k: DRAM >= 20x, disk >= 5x, Redis on loopback >= 5x faster.
- ``desync`` (``execstate_bench/desync.py``, ``execstate_bench/offload_desync.py``): the desync injection table over
  the three tiers (a small random MoE model: detection does not depend on size). Must be 100%.
- ``hibernate`` (``execstate_bench/offload_hibernate.py``; not in the default parts): ``hibernate_sessions``
  idle sessions of ``hibernate_tokens`` tokens hibernated with the pool back to empty, woken from
  DRAM and from Redis: wake and wake-to-first-token p50 / p99 (goals: p50 < 50 ms from DRAM,
  < 200 ms from Redis); woken sessions equal never-slept ones.

Redis: without ``--redis-url`` the benchmark starts its own ``redis-server`` (loopback, free port,
no persistence, ``--maxmemory 2gb``) and stops it at the end; with one, it uses that server and
deletes only its own keys (prefix ``execstate:unit:v1:``) between configurations. Without a Redis
server at all the Redis rows are left out (and say so).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from execstate.state.tiers.redis_store import DEFAULT_PREFIX
from execstate_bench.models import resolve_bench_model
from execstate_bench.redis_server import RedisServer, redis_server_available

PARTS = ("chat", "reload", "desync", "hibernate")
DEFAULT_PARTS = ("chat", "reload", "desync")


def run_offload_bench(model: str = "standard", parts: tuple[str, ...] = DEFAULT_PARTS, redis_url: str | None = None,
                      lengths: tuple[int, ...] = (1024, 4096, 16384), repeats: int = 3, tenants: int = 4,
                      conversations: int = 4, turns: int = 6, system_len: int = 128, context_len: int = 768,
                      user_len: int = 64, reply_len: int = 8, desync_repeats: int = 2, threads: int | None = 1,
                      png: str | None = None, hibernate_sessions: int = 1000, hibernate_tokens: int = 2048) -> dict:
    import torch

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    before = torch.get_num_threads()
    if threads:  # 0 or None: torch's default
        torch.set_num_threads(threads)
    try:
        return _run(model, parts, redis_url, lengths, repeats, tenants, conversations, turns, system_len,
                    context_len, user_len, reply_len, desync_repeats, png, (hibernate_sessions, hibernate_tokens))
    finally:
        torch.set_num_threads(before)


def _run(model: str, parts: tuple[str, ...], redis_url: str | None, lengths: tuple[int, ...], repeats: int,
         tenants: int, conversations: int, turns: int, system_len: int, context_len: int, user_len: int,
         reply_len: int, desync_repeats: int, png: str | None, hibernation: tuple[int, int] = (1000, 2048)) -> dict:
    import torch

    report: dict = {"model": model, "parts": list(parts), "torch_threads": torch.get_num_threads()}
    server = None
    with tempfile.TemporaryDirectory(prefix="execstate-offload-bench-") as tmp:
        work = Path(tmp)
        if redis_url is None and redis_server_available():
            server = RedisServer(work / "redis", "--maxmemory", "2gb", "--maxmemory-policy", "allkeys-lru").start()
            redis_url = server.url
        report["redis"] = redis_url or "none (redis-server not installed and no --redis-url: Redis rows left out)"
        try:
            model_dir = resolve_bench_model(model) if {"chat", "reload", "hibernate"} & set(parts) else None
            if "chat" in parts:
                from execstate_bench.offload_chat import run_chat

                _clear_redis(redis_url)
                t0 = time.perf_counter()
                assert model_dir is not None  # resolved above for this part
                report["chat"] = run_chat(model_dir, work / "chat", redis_url, tenants=tenants,
                                          conversations=conversations, turns=turns, system_len=system_len,
                                          context_len=context_len, user_len=user_len, reply_len=reply_len)
                report["chat"]["seconds"] = time.perf_counter() - t0
            if "reload" in parts:
                from execstate_bench.offload_reload import run_reload

                _clear_redis(redis_url)
                assert model_dir is not None  # resolved above for this part
                report["reload"] = run_reload(model_dir, work / "reload", redis_url, lengths=lengths, repeats=repeats)
            if "hibernate" in parts:
                from execstate_bench.offload_hibernate import run_hibernate

                _clear_redis(redis_url)
                assert model_dir is not None  # resolved above for this part
                report["hibernate"] = run_hibernate(model_dir, work / "hibernate", redis_url, sessions=hibernation[0],
                                                    tokens=hibernation[1])
            if "desync" in parts:
                _clear_redis(redis_url)
                report["desync"] = _desync(work / "desync", redis_url, desync_repeats)
        finally:
            if server is not None:
                server.kill()
    report["ok"] = _ok(report)
    if png:
        from execstate_bench.offload_plot import plot_offload

        plot_offload(report, png)
        report["png"] = png
    return report


def _desync(work: Path, redis_url: str | None, repeats: int) -> dict:
    from execstate.model.random_models import make_random
    from execstate.session.lm.llm import LLM
    from execstate.session.lm.llm import LLM as SessionLLM
    from execstate_bench.desync import detection_table, run_trials
    from execstate_bench.offload_desync import TierDesyncTarget

    m0, m1 = make_random("qwen3_moe", work / "w0", seed=0), make_random("qwen3_moe", work / "w1", seed=1)
    oracle = LLM(str(m0), enable_return_routed_experts=True, num_kv_blocks=64, block_size=16, seed=0)
    from execstate_bench.hibernation_desync import HibernationDesyncTarget

    targets: list[TierDesyncTarget | HibernationDesyncTarget] = [
        TierDesyncTarget(t, m0, m1, oracle, work / t, redis_url=redis_url, seed=i)
        for i, t in enumerate(("dram", "disk", "redis")) if t != "redis" or redis_url is not None]
    session_oracle = SessionLLM(str(m0), enable_return_routed_experts=True, num_kv_blocks=64, block_size=16, seed=0)
    targets.append(HibernationDesyncTarget(m0, session_oracle))
    try:
        results = run_trials(targets, repeats=repeats)
    finally:
        for t in targets:
            t.close()
    rows = detection_table(results)
    return {"rows": [{"kind": r.kind, "targets": list(r.targets), "injected": r.injected, "detected": r.detected,
                      "rate": r.rate, "recompute": r.recompute, "error": r.error, "wrong": r.wrong} for r in rows],
            "trials": [{"target": r.target, "kind": r.kind, "detected": r.detected, "answered": r.answered,
                        "wrong": r.wrong, "caught_by": r.detail.split(":")[0]} for r in results]}


def _clear_redis(url: str | None) -> None:
    """Delete this benchmark's units from the server (only keys under the units' prefix)."""
    if url is None:
        return
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        batch = []
        for name in client.scan_iter(match=DEFAULT_PREFIX + "*", count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)
    finally:
        client.close()


def _ok(report: dict) -> bool:
    ok = True
    if "chat" in report:
        ok &= report["chat"]["reply_mismatches"] == 0
    if "reload" in report:
        ok &= report["reload"]["first_token_mismatches"] == 0
    if "hibernate" in report:
        ok &= report["hibernate"]["mismatches"] == 0
    if "desync" in report:
        ok &= all(r["rate"] == 1.0 and r["wrong"] == 0 for r in report["desync"]["rows"])
    return bool(ok)


def format_offload_table(report: dict) -> str:
    out = [f"model {report['model']}, torch threads {report['torch_threads']}, redis {report['redis']}"]
    chat = report.get("chat")
    if chat:
        w = chat["workload"]
        out.append(f"\nchat: {w['requests']} requests, {w['tenants']} tenants x {w['conversations_per_tenant']} "
                   f"conversations x {w['turns']} turns (system {w['system_len']}, context "
                   f"{w.get('context_len', 0)}, user {w['user_len']}, reply {w['reply_len']} tokens); working set "
                   f"{w['working_set_tokens']} tokens = {w['working_set_over_pool']:.1f}x the pool ({w['pool_tokens']} "
                   "tokens); interleaved")
        out.append(f"{'config':<18} {'TTFT p50':>9} {'p99':>9} {'p50 vs none':>11} {'computed':>9} {'from tiers':>10} "
                   f"{'prefix':>8} {'reload p50':>10}")
        for name, r in chat["configs"].items():
            reload = f"{r['reload_p50_s'] * 1e3:>8.1f}ms" if r.get("reload_p50_s") is not None else f"{'-':>10}"
            out.append(f"{name:<18} {r['ttft_p50_s'] * 1e3:>7.1f}ms {r['ttft_p99_s'] * 1e3:>7.1f}ms "
                       f"{r['p50_speedup_vs_none']:>10.2f}x {r['prefill_tokens_computed']:>9} "
                       f"{r['tokens_from_tiers']:>10} {r['tokens_from_prefix_cache']:>8} {reload}")
        out.append(f"reply mismatches vs no tier (tokens or routes): {chat['reply_mismatches']}")
    rel = report.get("reload")
    if rel:
        out.append(f"\nreload vs recompute (median of {rel['repeats']}; TTFT = arrival -> first token)")
        out.append(f"{'tokens':>7} {'tier':<10} {'TTFT':>9} {'x faster':>9} {'reload job':>10} {'GB/s':>6}")
        for n, row in rel["rows"].items():
            out.append(f"{n:>7} {'recompute':<10} {row['recompute_ttft_s'] * 1e3:>7.1f}ms")
            for tier, r in row.items():
                if isinstance(r, dict):
                    out.append(f"{n:>7} {tier:<10} {r['ttft_s'] * 1e3:>7.1f}ms {r['speedup_vs_recompute']:>8.1f}x "
                               f"{r['reload_job_s'] * 1e3:>8.1f}ms {r['reload_gb_s']:>6.2f}")
        out.append(f"first-token mismatches vs recompute: {rel['first_token_mismatches']}")
    hib = report.get("hibernate")
    if hib:
        w = hib["workload"]
        out.append(f"\nhibernation: {w['sessions']} idle sessions of {w['tokens_per_session']} tokens hibernated, pool "
                   "back to empty, each woken and stepped one token (p50 / p99)")
        out.append(f"{'tier':<7} {'wake':>15} {'wake->1st token':>17} {'recompute':>10} {'x faster':>8} {'units':>7}")
        for tier, r in hib["tiers"].items():
            out.append(f"{tier:<7} {r['wake_p50_s'] * 1e3:>6.1f}/{r['wake_p99_s'] * 1e3:>6.1f}ms "
                       f"{r['wake_to_first_token_p50_s'] * 1e3:>7.1f}/{r['wake_to_first_token_p99_s'] * 1e3:>6.1f}ms "
                       f"{r['recompute_p50_s'] * 1e3:>8.1f}ms {r['speedup_vs_recompute']:>7.1f}x "
                       f"{r['units_reloaded']:>7}")
        out.append(f"woken vs never-slept mismatches (first {w['checked']} sessions, tokens and routes): "
                   f"{hib['mismatches']}")
    des = report.get("desync")
    if des:
        from execstate_bench.desync import KindRow, format_detection_table

        rows = [KindRow(r["kind"], tuple(r["targets"]), r["injected"], r["detected"], r["recompute"], r["error"],
                        r["wrong"]) for r in des["rows"]]
        out.append("\ndesync injection (one unit corrupted per trial; detected = caught before use)")
        out.append(format_detection_table(rows))
    out.append(f"\nok: {report['ok']}" + (f"; plot {report['png']}" if report.get("png") else ""))
    return "\n".join(out)
