"""``execstate bench pd``: prefill/decode disaggregation against a single instance, over HTTP.

Processes (all ``execstate serve`` / ``execstate proxy`` subprocesses on 127.0.0.1, R3 on),
started in two phases so that no more NIXL agents than needed are alive while timing:

1. ``single`` (one instance, no connector), ``prefill`` (kv_producer) + ``decode``
   (kv_consumer) + ``proxy``: the timed workload;
2. then ``decode_fail`` + ``proxy_fail`` (``fault_injection: corrupt``, policy ``fail``) and
   ``decode_recompute`` + ``proxy_recompute`` (same fault, policy ``recompute``), both
   pulling from the same prefill instance: the failure checks.

Workload (DESIGN.md 8): per repeat, ``num_prompts`` fresh prompts of ``prompt_len`` random
token ids, each sent once, streamed, one request at a time, to the single instance and to
the proxy (interleaved, the order alternating per prompt, so machine noise hits both alike;
no prompt is ever sent twice to one path, so nothing hits a prefix cache). Greedy,
``ignore_eos``, ``max_tokens`` new tokens. TTFT = request sent -> first SSE chunk carrying a
token id; throughput = generated tokens / wall time of the request. A warm-up request per path
(full length; the failing path: short) precedes the timed ones: the first prefill of a
given size allocates, and each decode side's handshake with P is cached per address.

Transfer figures are deltas of the decode instance's ``/metrics`` counters over the timed
PD requests; route bytes = ``n_moe_layers * top_k * 2`` (int16) per transferred token. The
route records travel *inside* the control bytes (manifest), so ``(route + control) / KV``
counts them twice: it is an upper bound, ``control / KV`` is the measured overhead.

Recovery (DESIGN.md 8, failure recovery time): one PD request through ``proxy_fail`` (an
error response is expected), then the same request retried through the healthy proxy;
``recovery_s`` = error received -> retry fully served. The recompute check sends a fresh
prompt to the single instance and through ``proxy_recompute``: it must succeed with equal
tokens (the corrupted and later blocks are recomputed on D).

Threads: every engine process gets ``OMP_NUM_THREADS = MKL_NUM_THREADS = threads`` (default:
all CPUs). Requests are sequential, so only one engine computes at a time (P while D waits,
then D) and each may use every core. The proxies and this client get one thread (they only
move bytes). Idle engines without a connector block on their queue; an engine with a NIXL
agent does not: NIXL's UCX progress thread polls without sleeping (``pthrDelay=0`` in the
``nixl`` Python API), about one core per PD process. The servers stay in this process's
session, so under the kernel's autogroup scheduling the whole bench is one group (it does
not take one share of a shared machine per server) and thread nice values apply across
the servers. The bench measures that
(``idle_profile``: cores per idle process, busy thread ids) and, with
``nice_busy_threads=True`` (``--nice-nixl-threads``), renices those threads to 19 so they
only take CPU that compute threads leave: a diagnostic, off by default.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from execstate.bench.throughput import STANDARD, resolve_bench_model

SERVED_NAME = "m"
TTFT_TARGET = 1.3
OVERHEAD_TARGET = 0.02
WARMUP_LEN = 256
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ---------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv_config(role: str, policy: str = "fail", fault: str | None = None, timeout_s: float = 10.0) -> str:
    extra: dict[str, Any] = {"transfer_timeout_s": timeout_s}
    if fault is not None:
        extra["fault_injection"] = {"mode": fault}
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role, "enable_routed_experts_transfer": True,
                       "kv_load_failure_policy": policy, "kv_connector_extra_config": extra})


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    url: str
    log: Path

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """user + system CPU seconds of the process (its threads included), from /proc."""
        try:
            fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            return float("nan")


@dataclass
class Cluster:
    """The bench's subprocesses; ``close`` stops every one of them (SIGINT, then SIGKILL)."""

    threads: int
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="execstate-bench-pd-")))
    procs: dict[str, Proc] = field(default_factory=dict)

    def spawn(self, name: str, args: list[str], threads: int) -> str:
        port = free_port()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        log = self.logdir / f"{name}.log"
        with open(log, "wb") as fh:  # a file, not a pipe: a full pipe would block the server
            popen = subprocess.Popen([sys.executable, "-m", "execstate", *args, "--port", str(port)],
                                     env=env, stdout=fh, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        self.procs[name] = Proc(name, popen, url, log)
        return url

    def serve(self, name: str, model: Path, kv: str | None = None) -> str:
        args = ["serve", str(model), "--served-model-name", SERVED_NAME, "--enable-return-routed-experts"]
        return self.spawn(name, args + (["--kv-transfer-config", kv] if kv else []), self.threads)

    def proxy(self, name: str, prefill: str, decode: str) -> str:
        return self.spawn(name, ["proxy", "--prefill", prefill, "--decode", decode], 1)

    def wait_healthy(self, client: Any, names: list[str] | None = None, timeout_s: float = 300.0) -> float:
        """Wait until the processes (default: all) answer ``/health`` with 200; returns the seconds waited."""
        import httpx

        t0 = time.monotonic()
        pending = {n: self.procs[n] for n in (names or self.procs)}
        while pending:
            for name, p in list(pending.items()):
                if p.popen.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.popen.returncode}:\n{p.log_tail()}")
                try:
                    if client.get(p.url + "/health", timeout=2.0).status_code == 200:
                        del pending[name]
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"not healthy after {timeout_s:.0f} s: {sorted(pending)}")
            time.sleep(0.25)
        return time.monotonic() - t0

    def close(self) -> None:
        for p in self.procs.values():
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGINT)
        for p in self.procs.values():
            try:
                p.popen.wait(15)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(5)
        shutil.rmtree(self.logdir, ignore_errors=True)

    def idle_profile(self, names: list[str], window_s: float = 2.0) -> dict[str, Any]:
        """CPU cores each (idle) process uses over ``window_s``, and its threads using >= 0.1 core."""
        before = {n: _thread_cpu(self.procs[n].popen.pid) for n in names}
        time.sleep(window_s)
        out: dict[str, Any] = {}
        for n in names:
            after = _thread_cpu(self.procs[n].popen.pid)
            per = {t: (v - before[n].get(t, 0.0)) / window_s for t, v in after.items()}
            out[n] = {"cores": round(sum(per.values()), 3),
                      "busy_threads": {t: round(c, 3) for t, c in per.items() if c >= 0.1}}
        return out

    def nice_busy_threads(self, profile: dict[str, Any]) -> dict[str, list[int]]:
        """Renice (19) the threads that were busy while their process was idle: NIXL's UCX
        progress thread polls without sleeping (``pthrDelay=0``); at nice 19 it only gets the
        CPU that compute threads leave. Never the main thread."""
        done: dict[str, list[int]] = {}
        for n, prof in profile.items():
            pid = self.procs[n].popen.pid
            for t in prof["busy_threads"]:
                if int(t) != pid:
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, int(t), 19)
                        done.setdefault(n, []).append(int(t))
        return done


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread id of a process (/proc)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for t in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                f = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()
                out[t] = (int(f[11]) + int(f[12])) / _TICK
    return out


# ---------------------------------------------------------------------------------------
# requests and metrics


@dataclass
class Result:
    ok: bool
    status: int
    error: str | None
    seconds: float  # request sent -> stream finished
    ttft_s: float | None  # request sent -> first chunk with a token id
    token_ids: list[int]
    usage: dict[str, Any] | None
    t_first: float | None = None  # perf_counter of the first token
    t_end: float = 0.0  # perf_counter at the end of the response

    @property
    def tok_s(self) -> float | None:
        return len(self.token_ids) / self.seconds if self.ok and self.seconds > 0 else None


def stream_completion(client: Any, url: str, prompt: list[int], max_tokens: int) -> Result:
    """One streamed greedy completion; an error is a non-200 status or an in-band error event."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "stream": True,
            "stream_options": {"include_usage": True}}
    tokens: list[int] = []
    usage = error = None
    t_first = None
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = r.read().decode(errors="replace")
            t = time.perf_counter()
            return Result(False, r.status_code, text[:500], t - t0, None, [], None, None, t)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                error = json.dumps(ev["error"])[:500]
                continue
            for c in ev.get("choices") or []:
                ids = c.get("token_ids") or []
                if ids and t_first is None:
                    t_first = time.perf_counter()
                tokens += ids
            usage = ev.get("usage") or usage
    t = time.perf_counter()
    ttft = None if t_first is None else t_first - t0
    return Result(error is None, r.status_code, error, t - t0, ttft, tokens, usage, t_first, t)


def scrape(client: Any, url: str) -> dict[str, float]:
    """Unlabelled samples of a server's ``/metrics`` (counters as ``*_total``, histogram ``_sum``/``_count``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get(url + "/metrics", timeout=10.0).text
    return {s.name: float(s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples if not s.labels}


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


_KV = "execstate_kv_transfer"
_TTFT = "execstate_time_to_first_token_seconds_sum"


def _median(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None and x == x]
    return statistics.median(ys) if ys else None


def _sha256_bytes_per_s(nbytes: int = 32 << 20) -> float:
    import hashlib

    buf = np.ones(nbytes, dtype=np.uint8)
    t0 = time.perf_counter()
    hashlib.sha256(memoryview(buf)).digest()
    return nbytes / (time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------
# the benchmark


def run_pd_bench(
    model: str | Path = STANDARD,
    prompt_len: int = 2048,
    num_prompts: int = 4,
    max_tokens: int = 32,
    repeats: int = 3,
    *,
    threads: int | None = None,
    nice_busy_threads: bool = False,
    seed: int = 0,
    print_table: bool = True,
) -> dict[str, Any]:
    """Start the processes, run the workload and the failure checks, stop everything; the report."""
    import httpx

    from execstate.model.config import ModelConfig

    t_bench = time.perf_counter()
    threads = int(threads or os.cpu_count() or 1)
    path = resolve_bench_model(model)
    mc = ModelConfig.from_hf_dir(path)
    rng_base = [seed, prompt_len]

    def prompts(kind: int, r: int, n: int, length: int = prompt_len) -> list[list[int]]:
        return np.random.default_rng([*rng_base, kind, r]).integers(3, mc.vocab_size, (n, length)).tolist()

    load_before = os.getloadavg()
    cluster = Cluster(threads)
    client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))
    try:
        # phase 1: single instance and the PD path (only two NIXL agents alive while timing)
        cluster.serve("single", path)
        p = cluster.serve("prefill", path, kv_config("kv_producer"))
        d = cluster.serve("decode", path, kv_config("kv_consumer"))
        cluster.proxy("proxy", p, d)
        startup_s = cluster.wait_healthy(client)
        procs = cluster.procs
        warm_full, warm_short = prompts(9, 0, 1)[0], prompts(9, 1, 1, min(prompt_len, WARMUP_LEN))[0]
        _warm_up(client, cluster, ["single", "proxy"], warm_full)  # full length: the first big prefill
        idle = cluster.idle_profile(["single", "prefill", "decode"])
        niced = cluster.nice_busy_threads(idle) if nice_busy_threads else {}
        sha = _sha256_bytes_per_s()  # here: same conditions as the timed runs (one thread, this process)
        cpu0 = {n: pr.cpu_seconds() for n, pr in procs.items()}
        d0 = scrape(client, d)
        runs, mismatches = _timed_runs(client, cluster, [prompts(0, r, num_prompts) for r in range(repeats)],
                                       max_tokens)
        d1 = scrape(client, d)
        cpu_timed = {n: round(pr.cpu_seconds() - cpu0[n], 2) for n, pr in procs.items()}

        # phase 2: injected failures (a corrupting decode instance per policy, each behind its proxy)
        cluster.serve("decode_fail", path, kv_config("kv_consumer", "fail", "corrupt"))
        cluster.serve("decode_recompute", path, kv_config("kv_consumer", "recompute", "corrupt"))
        cluster.proxy("proxy_fail", p, procs["decode_fail"].url)
        cluster.proxy("proxy_recompute", p, procs["decode_recompute"].url)
        cluster.wait_healthy(client, ["decode_fail", "decode_recompute", "proxy_fail", "proxy_recompute"])
        _warm_up(client, cluster, ["proxy_fail"], warm_short)
        _warm_up(client, cluster, ["proxy_recompute"], prompts(9, 2, 1)[0])
        if nice_busy_threads:
            idle2 = cluster.idle_profile(["decode_fail", "decode_recompute"])
            niced.update(cluster.nice_busy_threads(idle2))
        recovery = _failure_and_recovery(client, cluster, prompts(1, 0, 2), max_tokens)

        report = _report(model, path, mc, threads, startup_s, runs, mismatches, d0, d1, recovery, sha,
                         dict(prompt_len=prompt_len, num_prompts=num_prompts, max_tokens=max_tokens,
                              repeats=repeats, seed=seed))
        report["idle_profile"] = idle
        report["niced_threads"] = niced
        report["cpu_seconds_timed_phase"] = cpu_timed
    finally:
        client.close()
        cluster.close()
    report["machine"] = {"cpu_count": os.cpu_count(), "loadavg_before": load_before,
                         "loadavg_after": os.getloadavg(), "python": sys.version.split()[0]}
    report["bench_seconds"] = time.perf_counter() - t_bench
    if print_table:
        print(format_table(report))
    return report


def _warm_up(client: Any, cluster: Cluster, names: list[str], prompt: list[int]) -> None:
    """One 2-token request of ``prompt`` per path (first allocations, each D's handshake with P).
    ``proxy_fail`` must fail (every load there is corrupted), every other path must succeed."""
    for name in names:
        w = stream_completion(client, cluster.procs[name].url, prompt, 2)
        if w.ok == (name == "proxy_fail"):
            raise RuntimeError(f"warm-up request to {name}: ok={w.ok}, error {w.error}")


def _timed_runs(client: Any, cluster: Cluster, prompt_sets: list[list[list[int]]], max_tokens: int
                ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, int]]]:
    """Each prompt to the single instance and through the proxy, the order alternating per prompt."""
    procs = cluster.procs
    runs: dict[str, list[dict[str, Any]]] = {"single": [], "pd": []}
    mismatches: list[dict[str, int]] = []
    for r, prompts in enumerate(prompt_sets):
        for i, ids in enumerate(prompts):
            order = ["single", "pd"] if i % 2 == 0 else ["pd", "single"]
            got: dict[str, Result] = {}
            for name in order:
                servers = ["single"] if name == "single" else ["prefill", "decode", "proxy"]
                m0 = {n: scrape(client, procs[n].url) for n in servers if n != "proxy"}
                cpu0 = {n: procs[n].cpu_seconds() for n in servers}
                load = os.getloadavg()[0]
                url = procs["single" if name == "single" else "proxy"].url
                res = got[name] = stream_completion(client, url, ids, max_tokens)
                cpu = {n: round(procs[n].cpu_seconds() - cpu0[n], 3) for n in servers}
                m1 = {n: scrape(client, procs[n].url) for n in m0}
                if not res.ok:
                    raise RuntimeError(f"{name} request failed (repeat {r}, prompt {i}): {res.error}")
                run = {"repeat": r, "prompt": i, "ttft_s": res.ttft_s, "seconds": res.seconds,
                       "tok_s": res.tok_s, "tokens": len(res.token_ids),
                       "sources": (res.usage or {}).get("prompt_token_sources") or {},
                       "server_ttft_s": {n: _delta(m1[n], m0[n], _TTFT) for n in m1},
                       "cpu_s": cpu, "loadavg_1m_before": load}
                if name == "pd":
                    run["transfer_s"] = _delta(m1["decode"], m0["decode"], f"{_KV}_seconds_total")
                runs[name].append(run)
            a, b = got["single"].token_ids, got["pd"].token_ids
            if a != b:
                first = next((k for k, (u, v) in enumerate(zip(a, b, strict=False)) if u != v), min(len(a), len(b)))
                mismatches.append({"repeat": r, "prompt": i, "first_divergence": first})
    return runs, mismatches


def _failure_and_recovery(client: Any, cluster: Cluster, ids: list[list[int]], max_tokens: int) -> dict[str, Any]:
    procs = cluster.procs
    url = {n: p.url for n, p in procs.items()}
    f0 = scrape(client, url["decode_fail"])
    t_send = time.perf_counter()
    bad = stream_completion(client, url["proxy_fail"], ids[0], max_tokens)
    retry = stream_completion(client, url["proxy"], ids[0], max_tokens)  # the client retries, healthy path
    f1 = scrape(client, url["decode_fail"])
    healthy_after = client.get(url["decode_fail"] + "/health").status_code == 200
    out: dict[str, Any] = {
        "failure": {"error_detected": not bad.ok, "status": bad.status, "error": bad.error,
                    "detect_s": bad.t_end - t_send, "tokens_before_error": len(bad.token_ids),
                    "decode_transfer_failures": _delta(f1, f0, f"{_KV}_failures_total"),
                    "faulty_decode_healthy_after": healthy_after},
        "retry_ok": retry.ok,
        "retry_prompt_token_sources": (retry.usage or {}).get("prompt_token_sources"),
        "recovery_s": retry.t_end - bad.t_end if retry.ok else None,
        "recovery_first_token_s": retry.t_first - bad.t_end if retry.ok and retry.t_first else None,
        "injection_to_served_s": retry.t_end - t_send if retry.ok else None,
    }
    r0 = scrape(client, url["decode_recompute"])
    ref = stream_completion(client, url["single"], ids[1], max_tokens)
    rec = stream_completion(client, url["proxy_recompute"], ids[1], max_tokens)
    r1 = scrape(client, url["decode_recompute"])
    out["recompute"] = {
        "ok": rec.ok, "error": rec.error, "ttft_s": rec.ttft_s, "single_ttft_s": ref.ttft_s,
        "tokens_equal_single": rec.ok and ref.ok and rec.token_ids == ref.token_ids,
        "prompt_token_sources": (rec.usage or {}).get("prompt_token_sources"),
        "decode_transfer_failures": _delta(r1, r0, f"{_KV}_failures_total"),
    }
    return out


def _report(model: Any, path: Path, mc: Any, threads: int, startup_s: float, runs: dict[str, list[dict[str, Any]]],
            mismatches: list[dict[str, int]], d0: dict[str, float], d1: dict[str, float],
            recovery: dict[str, Any], sha: float, workload: dict[str, Any]) -> dict[str, Any]:
    n_pd = len(runs["pd"])
    paths: dict[str, Any] = {}
    for name, rs in runs.items():
        per_repeat = [_median([x["ttft_s"] for x in rs if x["repeat"] == r]) for r in range(workload["repeats"])]
        paths[name] = {"ttft_s": [x["ttft_s"] for x in rs], "tok_s": [x["tok_s"] for x in rs],
                       "median_ttft_s": _median([x["ttft_s"] for x in rs]),
                       "median_tok_s": _median([x["tok_s"] for x in rs]),
                       "median_ttft_s_per_repeat": per_repeat,
                       "prefix_hit_tokens": sum(x["sources"].get("local_cache", 0) for x in rs),
                       "runs": rs}
    ts, tp = paths["single"]["median_ttft_s"], paths["pd"]["median_ttft_s"]
    paired = [b["ttft_s"] / a["ttft_s"] for a, b in zip(runs["single"], runs["pd"], strict=True)]
    ttft_ratio = tp / ts if ts and tp else None

    kv_b = _delta(d1, d0, f"{_KV}_bytes_total")
    ctl_b = _delta(d1, d0, f"{_KV}_control_bytes_total")
    secs = _delta(d1, d0, f"{_KV}_seconds_total")
    transferred = sum(x["sources"].get("transferred", 0) for x in runs["pd"])
    route_b = transferred * mc.num_moe_layers * mc.top_k * 2
    per = (lambda v: v / n_pd) if n_pd else (lambda v: None)
    transfer = {
        "transfers": _delta(d1, d0, f"{_KV}s_total"), "failures": _delta(d1, d0, f"{_KV}_failures_total"),
        "kv_bytes_per_request": per(kv_b), "control_bytes_per_request": per(ctl_b),
        "route_bytes_per_request": per(route_b), "transferred_tokens_per_request": per(transferred),
        "route_bytes_per_token": mc.num_moe_layers * mc.top_k * 2,
        "kv_bytes_per_token": kv_b / transferred if transferred else None,
        "control_over_kv": ctl_b / kv_b if kv_b else None,
        "route_plus_control_over_kv": (route_b + ctl_b) / kv_b if kv_b else None,
        "overhead_target": OVERHEAD_TARGET,
        "transfer_seconds_per_request": per(secs),
        "bandwidth_bytes_per_s": kv_b / secs if secs else None,
    }
    transfer["overhead_ok"] = (transfer["route_plus_control_over_kv"] or 1.0) < OVERHEAD_TARGET

    # where PD's TTFT goes (medians of per-request server-side figures)
    pd = runs["pd"]
    breakdown = {
        "prefill_server_ttft_s": _median([x["server_ttft_s"]["prefill"] for x in pd]),
        "decode_server_ttft_s": _median([x["server_ttft_s"]["decode"] for x in pd]),
        "decode_transfer_s": _median([x["transfer_s"] for x in pd]),
        "http_and_proxy_s": _median([x["ttft_s"] - x["server_ttft_s"]["prefill"] - x["server_ttft_s"]["decode"]
                                     for x in pd]),
        "single_server_ttft_s": _median([x["server_ttft_s"]["single"] for x in runs["single"]]),
        "single_http_s": _median([x["ttft_s"] - x["server_ttft_s"]["single"] for x in runs["single"]]),
        "sha256_bytes_per_s": sha,
        "checksum_s_per_side_estimate": per(kv_b) / sha if n_pd and kv_b else None,
    }
    return {
        "model": str(model), "model_path": str(path), "architecture": mc.architecture,
        "n_moe_layers": mc.num_moe_layers, "top_k": mc.top_k, "threads": threads, "workload": workload,
        "startup_s": startup_s, "paths": paths,
        "ratios": {"ttft_pd_over_single": ttft_ratio, "ttft_paired_median": _median(paired),
                   "ttft_target": TTFT_TARGET, "ttft_ok": ttft_ratio is not None and ttft_ratio <= TTFT_TARGET,
                   "tok_s_pd_over_single": (paths["pd"]["median_tok_s"] / paths["single"]["median_tok_s"]
                                            if paths["single"]["median_tok_s"] else None)},
        "transfer": transfer, "breakdown": breakdown,
        "correctness": {"compared": n_pd, "token_mismatches": len(mismatches), "mismatched": mismatches},
        "recovery": recovery,
    }


def _f(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def format_table(rep: dict[str, Any]) -> str:
    wl, t, b, rc = rep["workload"], rep["transfer"], rep["breakdown"], rep["recovery"]
    ra = rep["ratios"]
    lines = [
        f"execstate PD bench — {rep['model']} ({rep['architecture']}, {rep['n_moe_layers']} MoE layers, "
        f"top-{rep['top_k']}), fp32, {rep['threads']} threads per engine process",
        f"workload: {wl['num_prompts']} prompts x {wl['prompt_len']} tokens -> {wl['max_tokens']} tokens, greedy, "
        f"one at a time, streamed; {wl['repeats']} repeats, fresh prompts per repeat; startup {rep['startup_s']:.1f} s",
        "",
        f"{'path':<28}{'TTFT s (median)':>16}{'tok/s (median)':>16}  TTFT per request",
    ]
    for name, label in (("single", "single instance"), ("pd", "PD (proxy -> P -> D)")):
        e = rep["paths"][name]
        lines.append(f"{label:<28}{_f(e['median_ttft_s']):>16}{_f(e['median_tok_s'], '.2f'):>16}  "
                     + " ".join(_f(x, ".2f") for x in e["ttft_s"]))
    lines += [
        f"TTFT PD / single: {_f(ra['ttft_pd_over_single'])} (paired median {_f(ra['ttft_paired_median'])}; "
        f"target <= {ra['ttft_target']}: {'ok' if ra['ttft_ok'] else 'MISSED'}); "
        f"tok/s PD / single: {_f(ra['tok_s_pd_over_single'])}",
        f"transfer per request: KV {_f(t['kv_bytes_per_request'], ',.0f')} B, control "
        f"{_f(t['control_bytes_per_request'], ',.0f')} B, routes {_f(t['route_bytes_per_request'], ',.0f')} B "
        f"({t['route_bytes_per_token']} B x {_f(t['transferred_tokens_per_request'], '.0f')} tokens; inside control)",
        f"(route + control) / KV = {_f(t['route_plus_control_over_kv'], '.4%')} (control / KV "
        f"{_f(t['control_over_kv'], '.4%')}; target < {t['overhead_target']:.0%}: "
        f"{'ok' if t['overhead_ok'] else 'MISSED'}); transfers {t['transfers']:.0f}, failures {t['failures']:.0f}",
        f"effective bandwidth: {_f((t['bandwidth_bytes_per_s'] or 0) / 1e9, '.2f')} GB/s "
        f"({_f(t['transfer_seconds_per_request'])} s per transfer, incl. handshake check, manifest, read, checksums)",
        f"PD TTFT breakdown (medians): P server {_f(b['prefill_server_ttft_s'])} s (prefill + export), D server "
        f"{_f(b['decode_server_ttft_s'])} s (of which transfer {_f(b['decode_transfer_s'])} s), HTTP + proxy "
        f"{_f(b['http_and_proxy_s'])} s; single: server {_f(b['single_server_ttft_s'])} s, HTTP "
        f"{_f(b['single_http_s'])} s; sha256 {_f(b['sha256_bytes_per_s'] / 1e9, '.2f')} GB/s -> ~"
        f"{_f(b['checksum_s_per_side_estimate'])} s checksums per side",
        f"correctness: {rep['correctness']['token_mismatches']} token mismatches over "
        f"{rep['correctness']['compared']} prompts (PD vs single); prefix-hit tokens single "
        f"{rep['paths']['single']['prefix_hit_tokens']}, PD {rep['paths']['pd']['prefix_hit_tokens']}",
    ]
    f = rc["failure"]
    lines.append(f"injected corrupt (policy fail): error {'detected' if f['error_detected'] else 'NOT DETECTED'} "
                 f"after {_f(f['detect_s'])} s (status {f['status']}; D failures +{f['decode_transfer_failures']:.0f}; "
                 f"D healthy after: {f['faulty_decode_healthy_after']}); recovery (error -> retry served via the "
                 f"healthy path) {_f(rc['recovery_s'])} s, to first token {_f(rc['recovery_first_token_s'])} s, "
                 f"injection -> served {_f(rc['injection_to_served_s'])} s")
    r = rc["recompute"]
    lines.append(f"injected corrupt (policy recompute): {'ok' if r['ok'] else 'FAILED'}, tokens equal single: "
                 f"{r['tokens_equal_single']}, TTFT {_f(r['ttft_s'])} s (single {_f(r['single_ttft_s'])} s), "
                 f"sources {r['prompt_token_sources']}")
    m = rep.get("machine")
    if m:
        loads = [x["loadavg_1m_before"] for p in rep["paths"].values() for x in p["runs"]]
        lines.append(f"machine: {m['cpu_count']} CPUs; 1-min load avg before {m['loadavg_before'][0]:.1f}, "
                     f"during runs {min(loads):.1f}..{max(loads):.1f}, after {m['loadavg_after'][0]:.1f}; "
                     f"bench wall {rep['bench_seconds']:.0f} s")
    if rep.get("idle_profile"):
        lines.append("idle CPU cores per process before timing: " + ", ".join(
            f"{k} {v['cores']:.2f} (busy threads {len(v['busy_threads'])})" for k, v in rep["idle_profile"].items())
            + ("; reniced to 19: " + str(rep["niced_threads"]) if rep.get("niced_threads") else ""))
    if rep.get("cpu_seconds_timed_phase"):
        lines.append("CPU s per process over the timed phase: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in rep["cpu_seconds_timed_phase"].items()))
    return "\n".join(lines)
