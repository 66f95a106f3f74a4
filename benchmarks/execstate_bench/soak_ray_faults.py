"""The fleet soak's own clients and faults (``soak_ray.py``): resident sessions, the version probe,
a replica killed mid-load and a rolling weight update.

- :class:`Resident`: a session opened at the start and stepped in turn all run long
  (:func:`residents_loop`), so some sessions live on the replica that is killed. Each step's
  ``step_index`` and serving replica are kept: after the kill, the killed replica's residents are
  stepped at once (:func:`resume_time`) until one answers, which gives the time to resume as a
  client sees it and the steps lost (those after the session's last copy to the shared tier).
  After the weight update a session's next step is refused ``stale_state`` (its context was
  computed by the old weights; docs/sessions.md "Identity"), and the HTTP API has no reset: the
  resident is closed and opened again under a new id (:func:`reopen_stale`), as a client does.
- :class:`Probe`, :func:`probe_once`: greedy completions of fixed prompts, one a second all run
  long and back to back around the update (:func:`dense_probe`); each answer's tokens are compared
  with the oracle's tokens of the weights version the answer names (header
  ``x-execstate-weights-version``): a *wrong-version* answer is one whose tokens are not its
  named version's (a request served across a switch, or by the wrong weights).
- :func:`replica_kill`: four long streams started (:func:`stream_through`), then, once each has
  its first chunk, SIGKILL of the replica holding the most resident sessions (its PID from
  ``GET /v1/fleet/replicas``); the record: victim, how its streams and the others ended, its
  residents' resume times and steps lost, when Ray's replacement registered, the sessions the
  ingress resumed from the victim.
- :func:`rolling_update`: ``POST /v1/fleet/update_weights`` to the second weights (same shapes,
  other values) while the load runs; the record: its window and each replica's new version.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from execstate_bench.soak_clients import NAME, Soak, ids

REPLICA_HEADER, VERSION_HEADER = "x-execstate-replica", "x-execstate-weights-version"
NEW_VERSION = "user:v1"  # what the fleet names the version the update supplies as "v1" (namespaced)
RESIDENTS_PER_REPLICA = 2
RESIDENT_PERIOD_S = 2.0  # each resident session takes a step about this often
RESUME_DEADLINE_S = 120.0
STREAM_SPACING_S = 0.7  # between the kill's streams: past the router's load stats period (0.5 s)
REPLACEMENT_DEADLINE_S = 600.0


@dataclass
class Resident:
    sid: str
    auth: str
    home: str  # the replica that answered its last step
    step: int = 0  # its last answered step_index
    paused: bool = False  # the kill's resume measurement steps it meanwhile
    generation: int = 0  # reopened this many times (a session refused ``stale_state`` after the update)


@dataclass
class Probe:
    """The version probe's prompts, the oracle's greedy tokens per version (``"v0"``, ``"v1"``) and
    the answers: (sent, answered, version named, replica, tokens equal to that version's)."""

    prompts: list[list[int]]
    want: dict[str, list[list[int]]]
    answers: list[tuple[float, float, str, str, bool]] = field(default_factory=list)


PROBE_MAX_TOKENS = 4


def oracle_tokens(model: Path, prompts: list[list[int]], block_size: int = 16) -> list[list[int]]:
    """Greedy tokens of ``prompts`` from a single in-process engine on ``model`` (the oracle)."""
    from execstate.engine.sampling_params import SamplingParams
    from execstate.session.lm.llm import LLM

    llm = LLM(str(model), seed=0, block_size=block_size)
    sp = SamplingParams(temperature=0.0, max_tokens=PROBE_MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


async def fleet_replicas(s: Soak) -> dict[str, Any]:
    r = await s.http.get(s.url + "/v1/fleet/replicas", timeout=30, headers={"Authorization": f"Bearer {s.keys[0]}"})
    r.raise_for_status()
    return r.json()


async def open_residents(s: Soak, n: int) -> list[Resident]:
    out = []
    for i in range(n):
        res = Resident(f"resident-{i}", f"Bearer {s.keys[i % 2]}", "")
        await _open(s, res)
        out.append(res)
    return out


async def _open(s: Soak, res: Resident) -> None:
    r = await s.http.post(s.url + "/v1/sessions", json={"session_id": res.sid, "sampling": {"max_tokens": 4}},
                          headers={"Authorization": res.auth})
    r.raise_for_status()
    res.home, res.step = r.headers.get(REPLICA_HEADER, ""), 0


async def reopen_stale(s: Soak, res: Resident) -> None:
    """A session refused ``stale_state`` (its context was computed by the weights before the update;
    the HTTP API has no reset): closed, and opened again under a new id, as a client does."""
    t = time.monotonic()
    await s.http.delete(s.url + f"/v1/sessions/{res.sid}", headers={"Authorization": res.auth})
    res.generation += 1
    res.sid = f"{res.sid.split('-g')[0]}-g{res.generation}"
    try:
        await _open(s, res)
    except httpx.HTTPError as e:  # recorded; the next step of this id finds no session (404) and retries
        s.record("resident_reopen", t, str(getattr(getattr(e, "response", None), "status_code", type(e).__name__)))


async def step_resident(s: Soak, res: Resident) -> httpx.Response | None:
    t = time.monotonic()
    try:
        r = await s.http.post(s.url + f"/v1/sessions/{res.sid}/step", json={"input": ids(_rng(res), 4)},
                              headers={"Authorization": res.auth})
    except httpx.HTTPError as e:
        s.record("resident_sessions", t, f"http:{type(e).__name__}")
        return None
    stale = r.status_code == 409 and _code(r) == "stale_state"
    s.record("resident_sessions", t, "stale_state" if stale else r.status_code)
    if r.status_code == 200:
        res.home, res.step = r.headers.get(REPLICA_HEADER, res.home), int(r.json()["step_index"])
    elif stale or (r.status_code == 404 and res.generation):
        await reopen_stale(s, res)
    return r


def _code(r: httpx.Response) -> str | None:
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _rng(res: Resident) -> random.Random:
    return random.Random(f"{res.sid}:{res.step}")


async def residents_loop(s: Soak, residents: list[Resident], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for res in residents:
            if stop.is_set():
                return
            if not res.paused:
                await step_resident(s, res)
            await asyncio.sleep(RESIDENT_PERIOD_S / max(1, len(residents)))


async def probe_once(s: Soak, probe: Probe, k: int) -> None:
    """One greedy completion of prompt ``k``, its tokens checked against the version it names."""
    t, t0 = time.monotonic(), s.now()
    body = {"model": NAME, "prompt": probe.prompts[k], "max_tokens": PROBE_MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    try:
        r = await s.http.post(s.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {s.keys[0]}"})
    except httpx.HTTPError as e:
        return s.record("version_probe", t, f"http:{type(e).__name__}")
    outcome: str | int = r.status_code
    if r.status_code == 200:
        version = r.headers.get(VERSION_HEADER, "?")
        got = list(r.json()["choices"][0]["token_ids"])
        right = got == probe.want["v1" if version == NEW_VERSION else "v0"][k]
        probe.answers.append((round(t0, 2), round(s.now(), 2), version, r.headers.get(REPLICA_HEADER, "?"), right))
        outcome = 200 if right else "wrong_version_tokens"
    s.record("version_probe", t, outcome)


async def version_probe(s: Soak, probe: Probe, stop: asyncio.Event, period_s: float = 1.0) -> None:
    i = 0
    while not stop.is_set():
        await probe_once(s, probe, i % len(probe.prompts))
        i += 1
        await asyncio.sleep(period_s)


async def dense_probe(s: Soak, probe: Probe, stop: asyncio.Event, lanes: int = 4) -> None:
    """``lanes`` probes back to back until ``stop``: requests in flight all through a short update."""
    async def lane(j: int) -> None:
        i = j
        while not stop.is_set():
            await probe_once(s, probe, i % len(probe.prompts))
            i += lanes

    await asyncio.gather(*(lane(j) for j in range(lanes)))


async def resume_time(s: Soak, res: Resident, t_kill: float) -> dict[str, Any]:
    """Step ``res`` (a session of the killed replica) until a step is answered: seconds from the kill,
    the step it resumed at, the steps lost, the answers before (e.g. 503 ``session_resumed``)."""
    res.paused = True
    before, seen = res.step, list[int | str]()
    try:
        while s.now() - t_kill < RESUME_DEADLINE_S:
            r = await step_resident(s, res)
            if r is not None and r.status_code == 200:
                return {"session_id": res.sid, "seconds": round(s.now() - t_kill, 2), "to": res.home,
                        "step_before": before, "step_after": res.step, "steps_lost": before + 1 - res.step,
                        "answers_before": seen}
            seen.append(r.status_code if r is not None else "transport")
            await asyncio.sleep(0.05)
        return {"session_id": res.sid, "seconds": None, "answers_before": seen, "step_before": before}
    finally:
        res.paused = False


async def stream_through(s: Soak, k: int, started: asyncio.Event, out: list[dict[str, Any]],
                         homes: list[str]) -> None:
    """A long streamed completion (surface ``kill_streams``); its replica appended to ``homes`` at
    its head, ``started`` set at its first chunk. Its end (in ``out``): ``ok`` at ``[DONE]``, else
    the error event's type (``replica_failed``: cut by the kill)."""
    t = time.monotonic()
    body = {"model": NAME, "prompt": ids(random.Random(k), 16), "max_tokens": 1000, "ignore_eos": True,
            "stream": True}
    replica, outcome = "", "closed"
    try:
        async with s.http.stream("POST", s.url + "/v1/completions", json=body,
                                 headers={"Authorization": f"Bearer {s.keys[k % 2]}"}) as r:
            replica, outcome = r.headers.get(REPLICA_HEADER, ""), str(r.status_code)
            homes.append(replica)
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    started.set()
                if line == "data: [DONE]":
                    outcome = "ok"
                elif line.startswith('data: {"error"'):
                    outcome = json.loads(line[6:])["error"].get("type") or "stream_error"
    except httpx.HTTPError as e:
        outcome = f"http:{type(e).__name__}"
    finally:
        started.set()
    s.record("kill_streams", t, outcome)
    out.append({"replica": replica, "outcome": outcome})


async def replica_kill(s: Soak, residents: list[Resident], replicas: int, streams: int = 4) -> dict[str, Any]:
    """``streams`` long streams started (each has its first chunk), then the replica holding the
    most resident sessions SIGKILLed; the record (module docstring)."""
    ended: list[dict[str, Any]] = []
    homes: list[str] = []
    marks = [asyncio.Event() for _ in range(streams)]
    running = []
    for k in range(streams):  # spaced past the router's load stats period, so they spread over the replicas
        running.append(asyncio.create_task(stream_through(s, k, marks[k], ended, homes)))
        await asyncio.sleep(STREAM_SPACING_S)
    await asyncio.wait_for(asyncio.gather(*(m.wait() for m in marks)), 120)
    listed = (await fleet_replicas(s))["replicas"]

    def holds(r: dict[str, Any]) -> tuple[bool, int, int]:  # residents there first, then streams
        n = sum(x.home == r["replica_id"] for x in residents)
        return n > 0, homes.count(r["replica_id"]), n

    victim = max(listed, key=holds)
    before = {r["replica_id"] for r in listed}
    lost = [x for x in residents if x.home == victim["replica_id"]]
    t_kill = s.now()
    os.kill(int(victim["pid"]), signal.SIGKILL)
    resumes = await asyncio.gather(*(resume_time(s, x, t_kill) for x in lost))
    replacement = None
    while s.now() - t_kill < REPLACEMENT_DEADLINE_S:
        now = (await fleet_replicas(s))["replicas"]
        if len(now) >= replicas and [r for r in now if r["replica_id"] not in before]:
            replacement = round(s.now() - t_kill, 1)
            break
        await asyncio.sleep(1.0)
    await asyncio.gather(*running)
    info = await fleet_replicas(s)
    on_victim = [x["outcome"] for x in ended if x["replica"] == victim["replica_id"]]
    return {"t_kill": round(t_kill, 2), "victim": victim["replica_id"], "pid": victim["pid"],
            "streams_on_victim": on_victim, "streams_elsewhere": [x["outcome"] for x in ended
                                                                  if x["replica"] != victim["replica_id"]],
            "residents_on_victim": len(lost), "resident_resumes": resumes,
            "replacement_registered_s": replacement,
            "resumed_by_ingress": [r for r in info["resumed"] if r.get("from") == victim["replica_id"]],
            "retried_requests": info["retried"]}


async def rolling_update(s: Soak, source: Path, probe: Probe) -> dict[str, Any]:
    """The update, with the probe sending back to back from a second before it to a second after."""
    stop = asyncio.Event()
    dense = asyncio.create_task(dense_probe(s, probe, stop))
    await asyncio.sleep(1.0)
    t0 = s.now()
    try:
        r = await s.http.post(s.url + "/v1/fleet/update_weights",  # the first key's tenant is the operator
                              json={"source": str(source), "weights_version": "v1"}, timeout=900,
                              headers={"Authorization": f"Bearer {s.keys[0]}"})
    finally:
        await asyncio.sleep(1.0)
        stop.set()
        await dense
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"text": r.text[:500]}
    return {"start": round(t0, 2), "end": round(s.now() - 1.0, 2), "status": r.status_code,
            "versions": body.get("versions"), "answer": None if r.status_code == 200 else body}
