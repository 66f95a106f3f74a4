"""``execstate bench voice``: the voice agent over ``/v1/voice/realtime`` on spoken conversations.

Workload: ``conversations`` scripted conversations of ``turns`` user turns (``voice_script``: plain
turns with mid-utterance pauses, delegated products, barge-ins, backchannels), spoken by eSpeak NG
(the user: ``en-us+f2`` at 150 wpm; the agent: ``en-us`` at 170 wpm), played into the server in
real time over the WebSocket and the agent's audio played back in real time by the client
(``voice_client``). The server is this process's app (``build_app``) on a fresh ``AsyncEngine`` of
the front model (``smollm2-135m``, greedy, replies of ``max_response_tokens``), with the default
audio engines. Each conversation runs once per mode, alternating: with the real recognizer
(``asr``: PocketSphinx with the demo phrases by default, ``execstate_bench/asr.py``) and with the oracle
(``voice_oracle``: the script's words at that recognizer's timing). Conversation ``i`` is spoken
in ``USER_VOICES[i % 3]``. Turn detection: ``semantic_vad`` (the front model scores the end of
the turn; its turns are prefilled while spoken) or ``server_vad``. Metrics: ``voice_metrics``,
and the speculative prefill's totals (the server's ``VoiceServer.prefill``); the targets are
judged on the real recognizer's run. A PNG timeline of the first conversation goes to ``png``.
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
from execstate_bench import voice_audio_store
from execstate_bench.duplex import BENCH_FRONT_PARAMS, CHATML, SYSTEM, _engine
from execstate_bench.machine import cpu_name, loadavg_1m
from execstate_bench.models import resolve_bench_model
from execstate_bench.voice_client import Recording, VoiceClient
from execstate_bench.voice_metrics import summarize
from execstate_bench.voice_oracle import OracleRecognizer
from execstate_bench.voice_script import spoken_conversation
from execstate_bench.voice_stages import agent_words_wer, pause_scores, stage_breakdown, turn_timelines

USER_RATE = 150
USER_VOICES = ("en-us+f2", "en-us+m3", "en-us")  # conversation i is spoken in USER_VOICES[i % 3]
AGENT_VOICE, AGENT_RATE = "en-us", 170
# server_vad, the server's defaults: a segment ends after 200 ms of silence, or 100 ms once its
# words end a sentence; a turn whose words do not end a sentence ends after 800 ms (speech_turns.py).
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 200,
       "sentence_end_silence_ms": 100, "end_of_turn_silence_ms": 800}
# semantic_vad: the front model scores the end of the turn (convert.EAGERNESS: medium for auto)
SEMANTIC = {"type": "semantic_vad", "eagerness": "auto", "threshold": 0.5, "prefix_padding_ms": 300}
TURN_DETECTION = {"semantic": SEMANTIC, "server": VAD}
TARGETS = {"response_latency_ms.p50": 500, "response_latency_ms.p99": 900, "interruption_latency_ms.p99": 150,
           "takeover_rate_on_pauses.rate": 0.1, "false_end_of_turn_on_pauses.rate": 0.05,
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


async def _conversation(url: str, turns: list, switch: _Switch, td: dict[str, Any]) -> Recording:
    import websockets
    from websockets.typing import Subprotocol

    async with websockets.connect(url + "/v1/voice/realtime", subprotocols=[Subprotocol("realtime")],
                                  max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": SYSTEM, "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": td},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": AGENT_VOICE}}}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        seconds = sum(u.seconds + g for t in turns for g, u, _ in (*t.parts, *t.interruption)) + 40 * len(turns)
        client = VoiceClient(ws, switch.oracle if switch.use_oracle else None, seconds)
        return await client.run(turns)


def run_voice_bench(model: str = "smollm2-135m", conversations: int = 2, turns: int = 8, seed: int = 0,
                    max_response_tokens: int = 32, threads: int = 1, png: str | None = None,
                    turn_detection: str = "semantic", modes: tuple[str, ...] = ("oracle", "real"),
                    asr: str = "pocketsphinx-demo", user_audio: str | None = None) -> dict[str, Any]:
    """``turn_detection``: ``semantic`` (semantic_vad) or ``server`` (server_vad); ``modes``: the
    runs of each conversation (``oracle``, ``real``); ``asr``: the real recognizer
    (``pocketsphinx-demo``, ``pocketsphinx``, ``moonshine``: ``execstate_bench/asr.py``);
    ``user_audio``: a ``.npz`` of the user's spoken conversations (``voice_audio_store``): read if
    it exists (made for this workload, else ValueError), else synthesised and written there, so
    that later runs hear the same audio (eSpeak's output differs per synthesis)."""
    from execstate.serve.app import build_app
    from execstate.voice.engines import VoiceEngines
    from execstate.voice.espeak import Espeak
    from execstate.voice.silero import SileroModel, SileroVAD
    from execstate_bench.asr import recognizer

    if threads:
        torch.set_num_threads(threads)
    path = resolve_bench_model(model)
    load_before = loadavg_1m()
    voices = [USER_VOICES[i % len(USER_VOICES)] for i in range(conversations)]
    spoken = {"seed": seed, "turns": turns, "voices": voices, "rate_wpm": USER_RATE}
    if user_audio is not None and Path(user_audio).exists():
        scripts = voice_audio_store.load(user_audio, spoken)
    else:
        scripts = [spoken_conversation(seed + i, turns, voices[i], USER_RATE) for i in range(conversations)]
        if user_audio is not None:
            voice_audio_store.save(user_audio, scripts, spoken)
    switch = _Switch(recognizer(asr))
    vad = SileroModel()
    engines = VoiceEngines(switch, Espeak(voice=AGENT_VOICE, rate=AGENT_RATE), lambda: SileroVAD(vad),
                           voice=AGENT_VOICE)
    eng = _engine(path, max_num_seqs=4)
    td = TURN_DETECTION[turn_detection]
    recs: dict[str, list[Recording]] = {m: [] for m in modes}
    prefill: dict[str, dict[str, int]] = {}
    try:
        app = build_app(eng, model, voice_engines=lambda: engines)
        app.state.voice.agent_config = AgentConfig(max_response_tokens=max_response_tokens, **CHATML)
        app.state.voice.front_params = BENCH_FRONT_PARAMS
        totals = app.state.voice.prefill
        with _serve(app) as url:
            for script in scripts:
                for mode in modes:
                    switch.select(mode == "oracle")
                    before = totals.as_dict()
                    recs[mode].append(asyncio.run(_conversation(url, script, switch, td)))
                    time.sleep(0.5)  # the connection's close (its agent's prefill totals) settles
                    after = totals.as_dict()
                    run = {k: after[k] - before[k] for k in after}
                    prefill[mode] = {k: prefill.get(mode, {}).get(k, 0) + v for k, v in run.items()}
    finally:
        eng.shutdown()
    report: dict[str, Any] = {
        "bench": "voice", "model": model, "machine": {"cpu": cpu_name(), "load_1m_before": load_before,
                                                      "load_1m_after": loadavg_1m()},
        "workload": {"conversations": conversations, "turns": turns, "seed": seed, "user_voices": voices,
                     "user_rate_wpm": USER_RATE, "agent_voice": AGENT_VOICE, "turn_detection": td, "asr": asr,
                     "max_response_tokens": max_response_tokens, "user_audio": user_audio,
                     "seconds": [round(r.seconds, 1) for m in modes for r in recs[m]]},
        **{m: summarize(recs[m]) for m in modes}, "prefill": prefill,
        "stages_ms": {m: stage_breakdown(recs[m]) for m in modes},
        "turn_timelines_s": {m: [{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
                                 for rec in recs[m] for row in turn_timelines(rec)] for m in modes},
        "pause_scores": {m: [row for rec in recs[m] for row in pause_scores(rec)] for m in modes},
        "agent_words_wer": {m: agent_words_wer([row for rec in recs[m] for row in turn_timelines(rec)]) for m in modes},
        "targets": TARGETS,
    }
    if png:
        from execstate_bench.voice_plot import plot_timeline

        mode = "real" if "real" in modes else modes[0]
        plot_timeline(recs[mode][0], Path(png), f"execstate bench voice: conversation 1 ({mode} ASR: {asr}), {model}, "
                      f"{td['type']}")
        report["png"] = png
    return report


def _get(d: dict[str, Any], key: str) -> Any:
    a, b = key.split(".")
    return d[a][b]


def format_voice_table(r: dict[str, Any]) -> str:
    rows = [("response latency p50 / p99 (ms)", "response_latency_ms", ("p50", "p99")),
            ("interruption latency p50 / p99 (ms)", "interruption_latency_ms", ("p50", "p99")),
            ("takeover rate on pauses", "takeover_rate_on_pauses", ("rate",)),
            ("false end of turn on pauses", "false_end_of_turn_on_pauses", ("rate",)),
            ("false interruptions on backchannels", "false_interruptions_on_backchannels", ("rate",)),
            ("resume after a false interruption p50 / max (ms)", "resume_after_false_interruption_ms", ("p50", "max")),
            ("ASR word error rate", "asr_wer", ("wer",))]
    w = r["workload"]
    modes = [m for m in ("oracle", "real") if m in r]
    out = [f"voice bench: {r['model']}, {w['conversations']} conversations x {w['turns']} turns, voices "
           f"{', '.join(w['user_voices'])}, {w['turn_detection']['type']}, ASR {w['asr']}; load "
           f"{r['machine']['load_1m_before']} -> {r['machine']['load_1m_after']}",
           f"{'metric':52s} " + " ".join(f"{m:>16s}" for m in modes) + "  n"]
    for name, key, fields in rows:
        out.append(f"{name:52s} " + " ".join(f"{_cell(r[m][key], fields):>16s}" for m in modes)
                   + "  " + "/".join(str(_n(r[m][key])) for m in modes))
    for m in modes:
        p = r["prefill"].get(m, {})
        out.append(f"speculative prefill ({m}): {p.get('speculations', 0)} speculations, {p.get('computed', 0)} tokens "
                   f"computed, {p.get('saved', 0)} saved at the replies, {p.get('wasted', 0)} wasted; "
                   f"{p.get('drafts', 0)} first steps drafted, {p.get('drafts_kept', 0)} spoken")
    for m in modes:
        st = r.get("stages_ms", {}).get(m, {})
        out.append(f"p50 from the end of speech ({m}, ms): " + ", ".join(f"{k} {v['p50']}" for k, v in st.items()))
    judged = "real" if "real" in r else modes[0]
    out.append(f"targets ({judged}): " + ", ".join(f"{k} <= {v}" for k, v in r["targets"].items()))
    ok = [_get(r[judged], k) is not None and _get(r[judged], k) <= v for k, v in r["targets"].items()]
    out.append(f"targets met: {sum(ok)}/{len(ok)}")
    return "\n".join(out)


def _cell(d: dict[str, Any], fields: tuple[str, ...]) -> str:
    return " / ".join("-" if d[f] is None else str(d[f]) for f in fields)


def _n(d: dict[str, Any]) -> Any:
    return d.get("n", d.get("words"))
