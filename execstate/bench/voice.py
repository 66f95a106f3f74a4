"""``execstate bench voice``: the voice agent over ``/v1/voice/realtime`` on spoken conversations.

Workload: ``conversations`` scripted conversations of ``turns`` user turns (``voice_script``: plain
turns with mid-utterance pauses, delegated products, barge-ins, backchannels), spoken by eSpeak NG
(the user: ``en-us+f2`` at 150 wpm; the agent: ``en-us`` at 170 wpm), played into the server in
real time over the WebSocket and the agent's audio played back in real time by the client
(``voice_client``). The server is this process's app (``build_app``) on a fresh ``AsyncEngine`` of
the front model (``smollm2-135m``, greedy, replies of ``max_response_tokens``), with the default
audio engines. Each conversation runs twice, alternating: with the real recognizer (PocketSphinx
with the demo phrases, ``voice/vocabulary.py``) and with the oracle (``voice_oracle``: the
script's words at that recognizer's timing). Metrics: ``voice_metrics``; the targets are the
oracle run's. A PNG timeline of the first conversation (oracle) goes to ``png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import uvicorn

from execstate.agent.config import AgentConfig
from execstate.bench.duplex import BENCH_FRONT_PARAMS, CHATML, SYSTEM, _engine
from execstate.bench.machine import cpu_name, loadavg_1m
from execstate.bench.models import resolve_bench_model
from execstate.bench.voice_client import Recording, VoiceClient
from execstate.bench.voice_metrics import summarize
from execstate.bench.voice_oracle import OracleRecognizer
from execstate.bench.voice_script import spoken_conversation

USER_VOICE, USER_RATE = "en-us+f2", 150
AGENT_VOICE, AGENT_RATE = "en-us", 170
# The server's defaults: a segment ends after 200 ms of silence, or 100 ms once its words end a
# sentence; a turn whose words do not end a sentence ends after 800 ms (speech_turns.py).
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 200,
       "sentence_end_silence_ms": 100, "end_of_turn_silence_ms": 800}
TARGETS = {"response_latency_ms.p50": 500, "interruption_latency_ms.p99": 150, "takeover_rate_on_pauses.rate": 0.3,
           "false_interruptions_on_backchannels.rate": 0.1}


class _Switch:
    """The recognizer the server's agents use: the real one or the oracle over it (per run)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.oracle = OracleRecognizer(real)
        self.use_oracle = False
        self.sample_rate = 16000

    def select(self, oracle: bool) -> None:
        """Before a conversation: the real recognizer, or a fresh oracle (the client places its words)."""
        self.use_oracle = oracle
        self.oracle = OracleRecognizer(self.real)

    def open(self) -> Any:
        return self.oracle.open() if self.use_oracle else self.real.open()


@contextlib.contextmanager
def _serve(app: Any) -> Iterator[str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the bench server did not start")
        time.sleep(0.02)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


async def _conversation(url: str, turns: list, switch: _Switch) -> Recording:
    import websockets
    from websockets.typing import Subprotocol

    async with websockets.connect(url + "/v1/voice/realtime", subprotocols=[Subprotocol("realtime")],
                                  max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": SYSTEM, "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": VAD},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": AGENT_VOICE}}}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        seconds = sum(u.seconds + g for t in turns for g, u, _ in (*t.parts, *t.interruption)) + 40 * len(turns)
        client = VoiceClient(ws, switch.oracle if switch.use_oracle else None, seconds)
        return await client.run(turns)


def run_voice_bench(model: str = "smollm2-135m", conversations: int = 2, turns: int = 8, seed: int = 0,
                    max_response_tokens: int = 32, threads: int = 1, png: str | None = None) -> dict[str, Any]:
    from execstate.serve.app import build_app
    from execstate.voice.engines import VoiceEngines
    from execstate.voice.espeak import Espeak
    from execstate.voice.pocketsphinx_asr import PocketSphinx
    from execstate.voice.silero import SileroVAD
    from execstate.voice.vocabulary import demo_phrases

    if threads:
        torch.set_num_threads(threads)
    path = resolve_bench_model(model)
    load_before = loadavg_1m()
    scripts = [spoken_conversation(seed + i, turns, USER_VOICE, USER_RATE) for i in range(conversations)]
    switch = _Switch(PocketSphinx(demo_phrases()))
    engines = VoiceEngines(switch, Espeak(voice=AGENT_VOICE, rate=AGENT_RATE), SileroVAD, voice=AGENT_VOICE)
    eng = _engine(path, max_num_seqs=4)
    recs: dict[str, list[Recording]] = {"oracle": [], "real": []}
    try:
        app = build_app(eng, model, voice_engines=lambda: engines)
        app.state.voice.agent_config = AgentConfig(max_response_tokens=max_response_tokens, **CHATML)
        app.state.voice.front_params = BENCH_FRONT_PARAMS
        with _serve(app) as url:
            for script in scripts:
                for mode in ("oracle", "real"):
                    switch.select(mode == "oracle")
                    recs[mode].append(asyncio.run(_conversation(url, script, switch)))
    finally:
        eng.shutdown()
    report: dict[str, Any] = {
        "bench": "voice", "model": model, "machine": {"cpu": cpu_name(), "load_1m_before": load_before,
                                                      "load_1m_after": loadavg_1m()},
        "workload": {"conversations": conversations, "turns": turns, "seed": seed, "user_voice": USER_VOICE,
                     "agent_voice": AGENT_VOICE, "server_vad": VAD, "max_response_tokens": max_response_tokens,
                     "seconds": [round(r.seconds, 1) for r in recs["oracle"] + recs["real"]]},
        "oracle": summarize(recs["oracle"]), "real": summarize(recs["real"]), "targets": TARGETS,
    }
    if png:
        from execstate.bench.voice_plot import plot_timeline

        plot_timeline(recs["oracle"][0], Path(png), f"execstate bench voice: conversation 1 (oracle), {model}")
        report["png"] = png
    return report


def _get(d: dict[str, Any], key: str) -> Any:
    a, b = key.split(".")
    return d[a][b]


def format_voice_table(r: dict[str, Any]) -> str:
    rows = [("response latency p50 / p99 (ms)", "response_latency_ms", ("p50", "p99")),
            ("interruption latency p50 / p99 (ms)", "interruption_latency_ms", ("p50", "p99")),
            ("takeover rate on pauses", "takeover_rate_on_pauses", ("rate",)),
            ("false interruptions on backchannels", "false_interruptions_on_backchannels", ("rate",)),
            ("resume after a false interruption p50 / max (ms)", "resume_after_false_interruption_ms", ("p50", "max")),
            ("ASR word error rate", "asr_wer", ("wer",))]
    out = [f"voice bench: {r['model']}, {r['workload']['conversations']} conversations x {r['workload']['turns']} "
           f"turns; load {r['machine']['load_1m_before']} -> {r['machine']['load_1m_after']}",
           f"{'metric':52s} {'oracle':>16s} {'real ASR':>16s}  n (oracle/real)"]
    for name, key, fields in rows:
        o, a = r["oracle"][key], r["real"][key]
        out.append(f"{name:52s} {_cell(o, fields):>16s} {_cell(a, fields):>16s}  {_n(o)}/{_n(a)}")
    out.append("targets (oracle): " + ", ".join(f"{k} <= {v}" for k, v in r["targets"].items()))
    ok = [_get(r["oracle"], k) is not None and _get(r["oracle"], k) <= v for k, v in r["targets"].items()]
    out.append(f"targets met: {sum(ok)}/{len(ok)}")
    return "\n".join(out)


def _cell(d: dict[str, Any], fields: tuple[str, ...]) -> str:
    return " / ".join("-" if d[f] is None else str(d[f]) for f in fields)


def _n(d: dict[str, Any]) -> Any:
    return d.get("n", d.get("words"))
