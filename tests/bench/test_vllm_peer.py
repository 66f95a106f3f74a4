"""The throughput benchmark's vLLM peer without vLLM: the driver's JSON-lines protocol (run as a
real subprocess under this venv's python, which has no vLLM), its request checks, and the skip
path (no python given, a python that is not there, a python without vLLM). With vLLM's CPU build
at ``$EXECSTATE_VLLM_PYTHON`` a slow test also runs the real peer against the engine."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate_bench import vllm_driver
from execstate_bench.vllm_peer import (
    DRIVER,
    ENV_PYTHON,
    DriverError,
    DriverProcess,
    VllmPeer,
    add_vllm_peer,
    cpu_env,
    probe_vllm,
    vllm_python,
)

NO_VLLM_HERE = importlib.util.find_spec("vllm") is None
needs_no_vllm = pytest.mark.skipif(not NO_VLLM_HERE, reason="this venv has vLLM; the tests need a python without it")


def _talk(lines: list[str]) -> tuple[list[dict], int]:
    """Run the driver under this python, send ``lines``, return its replies and exit code."""
    p = subprocess.run([sys.executable, str(DRIVER)], input="".join(x + "\n" for x in lines), capture_output=True,
                       text=True, timeout=120)
    return [json.loads(x) for x in p.stdout.splitlines()], p.returncode


@needs_no_vllm
def test_driver_protocol_and_errors(tmp_path):
    replies, rc = _talk([
        json.dumps({"op": "probe"}),
        "{not json",
        json.dumps({"op": "fly"}),
        json.dumps({"op": "generate", "prompts": [[1, 2]], "max_tokens": 4}),
        json.dumps({"op": "load", "model": str(tmp_path / "missing")}),
        json.dumps({"op": "load", "model": str(tmp_path), "max_num_seqs": -1}),
        json.dumps({"op": "load", "model": str(tmp_path)}),  # valid request; vLLM does not import here
        json.dumps({"op": "quit"}),
        json.dumps({"op": "probe"}),  # after quit: never answered
    ])
    assert rc == 0 and len(replies) == 8  # one reply per request up to quit, then exit 0
    probe = replies[0]
    assert probe["ok"] is True and probe["protocol"] == vllm_driver.PROTOCOL == 1
    assert probe["python"] == platform.python_version() and probe["vllm"] is None
    assert "vllm" in probe["vllm_error"]
    assert replies[1] == {"ok": False, "error": replies[1]["error"]} and replies[1]["error"].startswith("not JSON")
    assert replies[2]["ok"] is False and "unknown op 'fly'" in replies[2]["error"]
    assert replies[3]["error"] == "no model loaded (send a load request first)"
    assert "model must be a directory" in replies[4]["error"]
    assert replies[5]["error"] == "max_num_seqs must be a non-negative integer"
    assert replies[6]["ok"] is False and "ModuleNotFoundError" in replies[6]["error"]
    assert replies[7] == {"ok": True}


def test_driver_stdout_is_only_protocol():
    """Whatever else the driver's process writes to fd 1 goes to stderr (vLLM logs there)."""
    code = ("import os, runpy, sys; sys.argv=['d']; os.write(1, b'noise before\\n'); "
            f"sys.stdin = __import__('io').StringIO('{{\"op\": \"quit\"}}\\n'); "
            f"m = runpy.run_path({str(DRIVER)!r}, run_name='not_main'); "
            "sys.exit(m['main']())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert p.stdout.splitlines() == ["noise before", '{"ok": true}']
    # and after main() took over fd 1, prints land on stderr:
    code2 = code.replace("sys.exit(m['main']())",
                         "rc = m['main'](); print('late noise'); os.write(1, b'late fd noise\\n'); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines() == ["noise before", '{"ok": true}']
    assert "late noise" in p.stderr and "late fd noise" in p.stderr


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=12)


@given(req=_json | st.fixed_dictionaries({"op": st.sampled_from(vllm_driver.OPS)}, optional={
    "prompts": _json, "max_tokens": _json, "batched": _json, "probe_prefill": _json, "model": _json,
    "dtype": _json, "seed": _json}), loaded=st.booleans())
@settings(max_examples=300, deadline=None)
def test_check_request_never_raises(req, loaded):
    err = vllm_driver.check_request(req, loaded)
    assert err is None or (isinstance(err, str) and err)
    if err is None:  # accepted: the shapes the driver relies on hold
        assert req["op"] in vllm_driver.OPS
        if req["op"] == "generate":
            assert loaded and req["prompts"] and all(p and all(isinstance(t, int) and t >= 0 for t in p)
                                                     for p in req["prompts"])
            assert isinstance(req["max_tokens"], int) and req["max_tokens"] >= 1


@given(prompts=st.lists(st.lists(st.integers(0, 10**6), min_size=1, max_size=8), min_size=1, max_size=4),
       n=st.integers(1, 10**4), batched=st.booleans())
def test_valid_generate_accepted_only_when_loaded(prompts, n, batched):
    req = {"op": "generate", "prompts": prompts, "max_tokens": n, "batched": batched, "probe_prefill": True}
    assert vllm_driver.check_request(req, loaded=True) is None
    assert vllm_driver.check_request(req, loaded=False) == "no model loaded (send a load request first)"
    assert (
        vllm_driver.check_request({**req, "max_tokens": True}, loaded=True) == "max_tokens must be a positive integer"
    )
    assert vllm_driver.check_request({**req, "prompts": [*prompts, [-1]]}, loaded=True) is not None


def test_skip_paths(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    assert vllm_python(None) is None
    version, why = probe_vllm(None)
    assert version is None and "--vllm-python" in why and ENV_PYTHON in why
    version, why = probe_vllm(str(tmp_path / "nope" / "python"))
    assert version is None and "is not an executable file" in why
    unavailable: dict[str, str] = {}
    peers: list = []
    add_vllm_peer(peers, unavailable, None, tmp_path, None, 2)
    assert peers == [] and "no vLLM python given" in unavailable["vllm"]
    monkeypatch.setenv(ENV_PYTHON, "/some/where/python")
    assert vllm_python(None) == "/some/where/python" and vllm_python("/x/python") == "/x/python"


@needs_no_vllm
def test_python_without_vllm_is_skipped_and_load_fails_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_PYTHON, sys.executable)
    version, why = probe_vllm(vllm_python(None))
    assert version is None and why.startswith(f"vLLM does not import with {sys.executable}")
    unavailable: dict[str, str] = {}
    peers: list = []
    add_vllm_peer(peers, unavailable, None, tmp_path, None, 2)
    assert peers == [] and unavailable["vllm"] == why
    peer = VllmPeer(sys.executable, "x", tmp_path, threads=2, max_model_len=64)
    with pytest.raises(DriverError, match="refused 'load'.*ModuleNotFoundError"):
        peer.load()
    assert peer.proc is None  # the driver was closed
    with pytest.raises(DriverError, match="not loaded"):
        peer.run([[1, 2]], 2, batched=True)


def test_driver_process_reports_death_with_stderr(tmp_path):
    d = DriverProcess(sys.executable)
    d.proc.stdin.close()  # end of input: the driver exits
    d.proc.wait(60)
    d.proc.stdin = open(os.devnull, "w")  # noqa: SIM115 - a writable stand-in so the request reaches readline
    with pytest.raises(DriverError, match="exited"):
        d.request({"op": "probe"})
    log = d.log_path
    assert d.close() == 0 and not log.exists()


def test_request_without_reply_in_time_kills_the_driver(tmp_path):
    # a "python" that reads its input and never answers (a real python's refusal could come back
    # before the deadline when this process is descheduled on a busy machine)
    silent = tmp_path / "python"
    silent.write_text("#!/bin/sh\nexec cat 3>&1 >&2\n")  # holds its output open (fd 3), writes none
    silent.chmod(0o755)
    d = DriverProcess(str(silent))
    with pytest.raises(DriverError, match="no reply to 'probe' within 0.2 s"):
        d.request({"op": "probe"}, timeout_s=0.2)
    assert d.proc.poll() is not None  # killed
    d.close()


def test_a_driver_that_closes_its_output_but_runs_on_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr("execstate_bench.vllm_peer.EXIT_WAIT_S", 0.2)
    mute = tmp_path / "python"
    mute.write_text("#!/bin/sh\nexec cat > /dev/null\n")  # its stdout (our pipe) closed, reading on
    mute.chmod(0o755)
    d = DriverProcess(str(mute))
    with pytest.raises(DriverError, match=r"exited \(rc -9\) during 'probe'"):
        d.request({"op": "probe"}, timeout_s=30)
    d.close()


def test_cpu_env(tmp_path, monkeypatch):
    for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    py = str(tmp_path / "bin" / "python")
    assert cpu_env(2, py) == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    assert cpu_env(4, py)["LD_PRELOAD"] == str(tmp_path / "lib" / "libiomp5.so")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert cpu_env(4, py)["VLLM_CPU_OMP_THREADS_BIND"] == "auto"  # the caller's setting wins


@pytest.mark.slow
def test_real_vllm_peer_matches_engine(tmp_path):
    """With vLLM's CPU build at $EXECSTATE_VLLM_PYTHON: the peer loads the standard model's
    weights and its greedy tokens agree with the engine's on most positions."""
    py = vllm_python(None)
    version, why = probe_vllm(py)
    if version is None:
        pytest.skip(why)
    import numpy as np

    from execstate import LLM, SamplingParams
    from execstate_bench.models import ensure_standard_model

    path = ensure_standard_model()
    prompts = np.random.default_rng(0).integers(0, 32000, size=(2, 32)).tolist()
    peer = VllmPeer(py, version, path, threads=os.cpu_count() or 1, max_model_len=64)
    peer.load()
    try:
        res = peer.run(prompts, 8, batched=True)
        single = peer.run(prompts[:1], 8, batched=False)
    finally:
        peer.close()
    assert [len(t) for t in res.token_ids] == [8, 8] and res.seconds > 0 and single.ttft_s and single.ttft_s[0] > 0
    assert single.token_ids[0] == res.token_ids[0]
    llm = LLM(str(path), dtype="float32", seed=0)
    ref = [list(o.outputs[0].token_ids) for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
    assert sum(a == b for r, t in zip(ref, res.token_ids, strict=True) for a, b in zip(r, t, strict=True)) >= 12
