"""At most one server serves a session at any time: the two-phase hand-over between real server
processes, with a failure injected at every step (docs/security.md).

Three ``execstate serve`` processes share the secret: S (the source), T (the target, engine id
``t-1``) and B (another instance, ``b-1``). S lists T twice in ``--migration-targets``: directly,
and through a proxy P in this process that forwards every call to T and can lose an answer, drop
a call, point at another server, or kill T right after forwarding. For every scenario a watcher
polls both S and T for the session (``GET``: serving = status ``open``), and the test checks the
invariant over the samples: no server is seen serving between two samples of the other serving
(a server's serving spans are contiguous, so that would be an overlap), and the ends are as the
protocol says:

=============================  ===========================================================================
scenario                       outcome
=============================  ===========================================================================
nothing fails                  T serves it (committed), S closed it; the offer, replayed, is refused by T
                               (``replay``) and by B (``wrong_target``)
T's answer is lost             S asks T (through P) to abort, T confirms, S serves again at once; T never
the commit is lost             S closed its copy on the acknowledgement, retries the commit until the offer
                               expires (``commit_failed``); T drops the import at its expiry: neither serves
the offer goes to B            B refuses it (not its engine); the abort is refused too, so S waits until the
                               offer's expiry plus the skew margin, then serves again; B never serves
T dies after importing         no acknowledgement; no abort can be confirmed; S serves again only after the
                               offer's expiry plus the skew margin
T is down before the offer     the offer never left S (connection refused): S serves again at once
=============================  ===========================================================================
"""

from __future__ import annotations

import json
import signal
import threading
import time
from contextlib import ExitStack

import pytest
from security_helpers import (
    KEY_A,
    Recorder,
    code_of,
    free_port,
    http,
    process_log,
    serving,
    start_process,
    stop_process,
    wait_healthy,
)

SECRET = "handover-processes-secret-0123456789"
SKEW_S = 1.0
WINDOW_S = 4.0
SAMPLING = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
PROMPT = list(range(40, 85))


def kv(engine_id: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": engine_id,
                       "kv_load_failure_policy": "fail", "enable_routed_experts_transfer": True,
                       "kv_connector_extra_config": {"transfer_timeout_s": 3.0}})


@pytest.fixture(scope="module")
def cluster(model_dir):
    proxy = Recorder()
    ports = {name: free_port() for name in "STB"}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    base = ["serve", str(model_dir), "--served-model-name", "m", "--enable-return-routed-experts", "--api-key", KEY_A,
            "--migration-skew-s", str(SKEW_S)]
    with ExitStack() as stack:
        p_url = stack.enter_context(serving(proxy.app))
        procs = {
            "S": start_process([*base, "--kv-transfer-config", kv("s-1"), "--migration-targets",
                                f"t-1={p_url},t-1={urls['T']}"], ports["S"], SECRET),
            "T": start_process([*base, "--kv-transfer-config", kv("t-1")], ports["T"], SECRET),
            "B": start_process([*base, "--kv-transfer-config", kv("b-1")], ports["B"], SECRET),
        }
        try:
            for name, proc in procs.items():
                wait_healthy(proc, urls[name])
            proxy.upstream = urls["T"]
            yield urls, p_url, proxy, procs
        finally:
            for proc in procs.values():
                stop_process(proc)


class Watcher:
    """Polls S and T for ``sid`` (serving or not) from a thread; ``check`` asserts the invariant."""

    def __init__(self, urls: list[str], sid: str) -> None:
        self.urls, self.sid = urls, sid
        self.samples: list[tuple[int, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _serving(self, url: str) -> bool:
        try:
            r = http("GET", f"{url}/v1/sessions/{self.sid}", KEY_A)
        except Exception:  # noqa: BLE001 - a dead server serves nothing
            return False
        return r.status_code == 200 and r.json()["status"] in ("open", "stepping")

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, url in enumerate(self.urls):
                self.samples.append((i, self._serving(url)))

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for i, url in enumerate(self.urls):  # and once more, at rest
            self.samples.append((i, self._serving(url)))
        self.check()

    def check(self) -> None:
        seq = self.samples
        for a in range(len(seq)):
            if not seq[a][1]:
                continue
            for b in range(a + 1, len(seq)):
                if seq[b][0] == seq[a][0]:
                    if not seq[b][1]:
                        break  # a's server stopped serving: a later sample of the other is no overlap
                    continue
                if seq[b][1]:
                    later = [s for s in seq[b + 1:] if s[0] == seq[a][0]]
                    assert not (later and later[0][1]), f"both servers served {self.sid}: samples {a}..{b}"

    def last(self, i: int) -> bool:
        return [s for s in self.samples if s[0] == i][-1][1]

    def ever(self, i: int) -> bool:
        return any(s[1] for s in self.samples if s[0] == i)


def open_session(url: str, sid: str) -> None:
    assert http("POST", f"{url}/v1/sessions", KEY_A, {"session_id": sid, "sampling": SAMPLING}).status_code == 200
    assert http("POST", f"{url}/v1/sessions/{sid}/step", KEY_A, {"input": PROMPT}).status_code == 200


def migrate(s_url: str, sid: str, target: str, window: float = 30.0):
    return http("POST", f"{s_url}/v1/sessions/{sid}/migrate", KEY_A, {"target": target, "timeout_s": window})


def step_code(url: str, sid: str) -> int:
    return http("POST", f"{url}/v1/sessions/{sid}/step", KEY_A, {"input": [9]}).status_code


def test_every_failure_leaves_at_most_one_server_serving(cluster):
    urls, p_url, proxy, procs = cluster
    s, t, b = urls["S"], urls["T"], urls["B"]

    # nothing fails: T serves the session from the commit on; the offer cannot be used again
    open_session(s, "ok")
    with Watcher([s, t], "ok") as w:
        r = migrate(s, "ok", p_url)
        assert r.status_code == 200 and r.json()["committed"] and r.json()["target_engine_id"] == "t-1", r.text
    assert (w.last(0), w.last(1)) == (False, True) and step_code(t, "ok") == 200
    offer = proxy.bodies("/v1/sessions/import")[-1]
    for url, code in ((t, "replay"), (b, "wrong_target")):
        r = http("POST", f"{url}/v1/sessions/import", content=offer, headers={"content-type": "application/msgpack"})
        assert code_of(r) == code, r.text
    assert all("authorization" not in h for _, _, h, _ in proxy.requests), "an API key went to another server"

    # T's acknowledgement is lost: the abort is confirmed, S serves again at once, T never did
    open_session(s, "lost-ack")
    proxy.status_for["/v1/sessions/import"] = 502
    with Watcher([s, t], "lost-ack") as w:
        r = migrate(s, "lost-ack", p_url)
        assert r.status_code == 502 and "still served here" in r.json()["error"]["message"], r.text
    proxy.status_for.clear()
    assert not w.ever(1) and w.last(0) and step_code(s, "lost-ack") == 200

    # the commit is lost: S closed its copy; T drops the import when the offer expires; nobody serves
    open_session(s, "lost-commit")
    proxy.drop.add("/v1/sessions/import/commit")
    with Watcher([s, t], "lost-commit") as w:
        r = migrate(s, "lost-commit", p_url, WINDOW_S)
        assert (r.status_code, code_of(r)) == (502, "commit_failed"), r.text
        time.sleep(1.0)  # T's sweep runs within seconds of the expiry
    proxy.drop.clear()
    assert not w.ever(1) and not w.last(0) and step_code(t, "lost-commit") in (404, 409, 410)

    # the offer reaches B (not its engine): refused, and so is the abort: S waits out the expiry
    open_session(s, "elsewhere")
    proxy.upstream = b
    with Watcher([s, b], "elsewhere") as w:
        t0 = time.monotonic()
        r = migrate(s, "elsewhere", p_url, WINDOW_S)
        assert code_of(r) == "wrong_target" and "served here again in" in r.json()["error"]["message"], r.text
        assert step_code(s, "elsewhere") == 409  # frozen (busy) until the offer expired plus the skew
        while step_code(s, "elsewhere") != 200:
            assert time.monotonic() - t0 < WINDOW_S + SKEW_S + 30, "S never served the session again"
            time.sleep(0.2)
    proxy.upstream = t
    assert not w.ever(1) and w.last(0)

    # T dies right after importing: no acknowledgement, no abort confirmed: S waits out the expiry
    open_session(s, "t-dies")
    proxy.after_forward["/v1/sessions/import"] = lambda: procs["T"].send_signal(signal.SIGKILL)
    proxy.status_for["/v1/sessions/import"] = 502  # T imported, then died before its answer got out
    with Watcher([s, t], "t-dies") as w:
        t0 = time.monotonic()
        r = migrate(s, "t-dies", p_url, WINDOW_S)
        assert r.status_code >= 500, r.text
        while step_code(s, "t-dies") != 200:
            assert time.monotonic() - t0 < WINDOW_S + SKEW_S + 30, "S never served the session again"
            time.sleep(0.2)
    proxy.status_for.clear()
    procs["T"].wait(10)
    assert w.last(0) and not w.last(1)

    # T is down before the offer: nothing was sent, S serves again at once
    open_session(s, "t-down")
    with Watcher([s, t], "t-down") as w:
        r = migrate(s, "t-down", t)
        assert (r.status_code, code_of(r)) == (502, "unreachable"), r.text + process_log(procs["S"])[-1000:]
    assert w.last(0) and step_code(s, "t-down") == 200
