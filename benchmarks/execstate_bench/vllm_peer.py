"""The throughput benchmark's vLLM peer: vLLM's CPU build, in a venv of its own, driven as a
subprocess running ``vllm_driver.py`` (its protocol is in that module's docstring).

Which python: ``--vllm-python PATH`` or the ``EXECSTATE_VLLM_PYTHON`` environment variable
(``vllm_python``); without either the peer is left out with a note. ``probe_vllm`` asks that
python's driver whether vLLM imports (and which version) before the peer is used.

``VllmPeer.load`` starts the driver and loads the weights directory with
``LLM(model=DIR, dtype=float32)`` (``dtype=bfloat16`` for the ``vllm_bf16`` peer) in vLLM's
default (compiled) mode; its CPU settings:
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache, default ``KVCACHE_GIB`` unless set) and
``VLLM_CPU_OMP_THREADS_BIND`` (default: the first ``threads`` CPUs, ``0-{threads-1}``, unless
set) and ``LD_PRELOAD`` of the venv's Intel OpenMP (``cpu_env``). ``run`` sends the same
prompt token ids, greedy, ``ignore_eos``, ``max_tokens``, and
gets back the wall time, the token ids (for parity) and the CPU time of the driver and its
children (for the clean-run share); every run also probes the prefill (time to first token,
a ``max_tokens=1`` run of the same prompts just before the timed one, outside its wall time).
``close`` sends ``quit`` and waits for the driver (killing it after ``QUIT_TIMEOUT_S``); a request
without a reply within ``REQUEST_TIMEOUT_S`` kills the driver and raises ``DriverError``.
The driver's stderr (vLLM's logs) goes to a temporary file; its tail is in every error.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

from execstate_bench.numbers import median
from execstate_bench.peers import Peer, RunResult

DRIVER = Path(__file__).with_name("vllm_driver.py")
ENV_PYTHON = "EXECSTATE_VLLM_PYTHON"
KVCACHE_GIB = 2
QUIT_TIMEOUT_S = 30.0
EXIT_WAIT_S = 10.0  # a driver whose output closed is killed if it has not exited by then
# No reply within this long (a load compiles for minutes on a busy machine): the driver is killed.
REQUEST_TIMEOUT_S = 1800.0


class DriverError(RuntimeError):
    """The driver answered ``ok: false``, or died; the message has its error or stderr tail."""


def vllm_python(explicit: str | None) -> str | None:
    """The python to run vLLM with: ``explicit``, else ``$EXECSTATE_VLLM_PYTHON``, else ``None``."""
    return explicit or os.environ.get(ENV_PYTHON) or None


class DriverProcess:
    """One running driver: ``request`` sends a request and returns its reply (``DriverError``
    on ``ok: false`` or a dead driver); ``close`` ends it. ``env`` is added to os.environ."""

    def __init__(self, python: str, env: dict[str, str] | None = None) -> None:
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise DriverError(f"vLLM python {python!r} is not an executable file")
        self._log: IO[bytes] = tempfile.NamedTemporaryFile(prefix="execstate-vllm-", suffix=".log", delete=False)  # noqa: SIM115
        self.log_path = Path(self._log.name)
        self.proc = subprocess.Popen([python, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env={**os.environ, **(env or {})}, text=True,
                                     bufsize=1)

    def request(self, req: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        """Send ``req`` and wait up to ``timeout_s`` for its reply (else kill the driver, raise)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise DriverError(f"vLLM driver is gone ({e}); {self.stderr_tail()}") from e
        # one request in flight and one reply line each, so nothing waits unread in the buffer
        if not select.select([self.proc.stdout], [], [], timeout_s)[0]:
            self.proc.kill()
            self.proc.wait()
            raise DriverError(f"vLLM driver gave no reply to {req.get('op')!r} within {timeout_s:g} s (killed); "
                              f"{self.stderr_tail()}")
        line = self.proc.stdout.readline()
        if not line:  # its output closed: it exits, or is of no more use (killed)
            try:
                rc = self.proc.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
            raise DriverError(f"vLLM driver exited (rc {rc}) during {req.get('op')!r}; {self.stderr_tail()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise DriverError(f"vLLM driver refused {req.get('op')!r}: {reply.get('error')}")
        return reply

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no stderr"
        return "stderr tail: " + text[-n:] if text else "no stderr"

    def close(self) -> int | None:
        """Ask the driver to quit; kill it if it has not exited after ``QUIT_TIMEOUT_S``."""
        if self.proc.poll() is None:
            with contextlib.suppress(DriverError, ValueError):
                self.request({"op": "quit"}, QUIT_TIMEOUT_S)
            try:
                self.proc.wait(QUIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self._log.close()
        self.log_path.unlink(missing_ok=True)
        return self.proc.returncode


def probe_vllm(python: str | None) -> tuple[str | None, str | None]:
    """``(vllm version, None)`` when ``python``'s driver imports vLLM, else ``(None, why not)``."""
    if python is None:
        return None, f"no vLLM python given (--vllm-python PATH or ${ENV_PYTHON})"
    try:
        d = DriverProcess(python)
    except DriverError as e:
        return None, str(e)
    try:
        reply = d.request({"op": "probe"})
    except (DriverError, ValueError) as e:
        return None, f"{python}: {e}"[:500]
    finally:
        d.close()
    if reply.get("vllm") is None:
        return None, f"vLLM does not import with {python}: {reply.get('vllm_error')}"[:500]
    return str(reply["vllm"]), None


def cpu_env(threads: int, python: str) -> dict[str, str]:
    """vLLM's CPU settings for the driver (the caller's own values win): KV cache space, OpenMP
    threads bound to CPUs ``0..threads-1`` (vLLM's ``auto`` would reserve one CPU for its
    scheduler, half of a 2-CPU machine), and Intel OpenMP preloaded where the venv has it
    (``intel-openmp`` is a dependency of the CPU build; vLLM's docs preload it for speed)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}
    iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)
    return {k: os.environ.get(k, v) for k, v in env.items()}


class VllmPeer(Peer):
    name = "vllm"

    def __init__(self, python: str, version: str, path: Path, threads: int, max_model_len: int,
                 max_num_seqs: int = 64, probe_prefill: bool = True, dtype: str = "float32") -> None:
        self.python, self.path, self.threads, self.probe_prefill = python, path, threads, probe_prefill
        self.max_model_len, self.max_num_seqs, self.dtype = max_model_len, max_num_seqs, dtype
        self.label = f"vLLM {version} (CPU build{', bf16' if dtype == 'bfloat16' else ''})"
        if dtype == "bfloat16":  # beside the engine's bf16 arithmetic, compared with it
            self.name, self.parity_reference, self.storage = "vllm_bf16", "execstate_bf16arith_r3_off", "bf16"
        self.proc: DriverProcess | None = None
        self.startup_seconds: list[float] = []
        self.settings: dict[str, Any] | None = None
        # timed runs only (after the warm-up): (prompt tokens, seconds) of each batched prefill probe
        self.prefill_batched: list[tuple[int, float]] = []
        self._timed = False

    def load(self) -> None:
        self.proc = DriverProcess(self.python, cpu_env(self.threads, self.python))
        try:
            reply = self.proc.request({"op": "load", "model": str(self.path), "dtype": self.dtype,
                                       "max_model_len": self.max_model_len, "max_num_seqs": self.max_num_seqs,
                                       "seed": 0})
        except Exception:
            self.close()
            raise
        self.startup_seconds.append(float(reply["seconds"]))
        self.settings = reply.get("settings")
        self._timed = False

    def after_warmup(self) -> None:
        self._timed = True

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()
        self.proc = None

    def run(self, prompts: list[list[int]], max_new_tokens: int, batched: bool) -> RunResult:
        if self.proc is None:
            raise DriverError("vLLM peer is not loaded")
        reply = self.proc.request({"op": "generate", "prompts": prompts, "max_tokens": max_new_tokens,
                                   "batched": batched, "probe_prefill": self.probe_prefill})
        prefill = [float(x) for x in reply["prefill_seconds"] or ()]
        if batched and self._timed and prefill:
            self.prefill_batched.append((sum(len(p) for p in prompts), prefill[0]))
        return RunResult([list(map(int, t)) for t in reply["token_ids"]], float(reply["seconds"]),
                         None if batched or not prefill else prefill, cpu_seconds=reply.get("cpu_seconds"))

    def prefill_once(self, prompts: list[list[int]]) -> float:
        """The driver's wall seconds of one ``max_tokens=1`` generation of all ``prompts`` (as its
        prefill probe measures; not added to ``prefill_batched``)."""
        if self.proc is None:
            raise DriverError("vLLM peer is not loaded")
        reply = self.proc.request({"op": "generate", "prompts": prompts, "max_tokens": 1, "batched": True,
                                   "probe_prefill": False})
        return float(reply["seconds"])

    def report_extra(self) -> dict[str, Any]:
        """Engine start, settings and the prefill of the batched runs (all prompts of a run in one
        ``max_tokens=1`` call: prompt tokens / wall s, median over the timed runs)."""
        return {"startup_seconds": self.startup_seconds, "settings": self.settings,
                "prefill_batched_seconds": [s for _, s in self.prefill_batched],
                "prefill_batched_tok_s": median([n / s for n, s in self.prefill_batched])}


def add_vllm_peer(peer_list: list[Peer], unavailable: dict[str, str], python: str | None, path: Path,
                  workload: Any, threads: int, probe_prefill: bool = True, dtype: str = "float32") -> None:
    """Append a ``VllmPeer`` for ``python`` (or ``$EXECSTATE_VLLM_PYTHON``) to ``peer_list`` when its
    driver imports vLLM; else record in ``unavailable`` why not. ``workload``: anything with
    ``prompt_len`` and ``max_new_tokens`` (the model length vLLM is started with); ``dtype``
    ``"bfloat16"``: the peer ``vllm_bf16`` (vLLM's ``dtype=bfloat16``)."""
    py = vllm_python(python)
    version, why = probe_vllm(py)
    if version is None or py is None:
        unavailable["vllm_bf16" if dtype == "bfloat16" else "vllm"] = why or "unavailable"
        return
    peer_list.append(VllmPeer(py, version, path, threads,
                              max_model_len=workload.prompt_len + workload.max_new_tokens,
                              probe_prefill=probe_prefill, dtype=dtype))
