"""The client of ``execstate bench voice``: speaks a scripted conversation into ``/v1/voice/realtime``
in real time and plays the agent's audio back in real time, as a person with a speaker would.

Three tasks on one loop: the *sender* sends 20 ms of the user's timeline every 20 ms (silence
unless an utterance was placed there); the *reader* records every server event with its arrival
time and plays the agent's audio (``voice/playback.py``'s clock: a hold pauses it, a resume
continues it, a cancelled reply clears it); the *director* walks the script, placing each turn's
utterances on the timeline when a person would say them: a turn when the agent is quiet, a
barge-in or backchannel ``interrupt_after_s`` after the reply started playing. Times are seconds
since the first sample was sent (the timeline's clock: sample ``k`` is sent at ``k / 16000``).
``Recording.marks`` holds what the metrics need (turn ends, pauses, interruptions) as timeline
samples; ``Recording.wall`` turns them into the times they were actually sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from execstate.voice.playback import PlaybackClock
from execstate_bench.voice_oracle import OracleRecognizer
from execstate_bench.voice_script import RATE, SpokenTurn, Utterance

OUT_RATE = 24000
TICK = 320  # 20 ms at 16 kHz


@dataclass
class Recording:
    user: np.ndarray  # the user's timeline (16 kHz), as sent
    agent: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (play time, 24 kHz samples)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    marks: list[dict[str, Any]] = field(default_factory=list)
    stops: list[tuple[float, str]] = field(default_factory=list)  # playback stopped: (time, why)
    resumes: list[float] = field(default_factory=list)
    sent_t: list[float] = field(default_factory=list)  # when each 20 ms chunk of the timeline was sent
    seconds: float = 0.0

    def wall(self, sample: int) -> float:
        """When the timeline's ``sample`` was sent (the sender may lag behind the timeline's clock)."""
        k = sample // TICK
        return self.sent_t[k] + (sample - k * TICK) / RATE if k < len(self.sent_t) else sample / RATE


class VoiceClient:
    def __init__(self, ws: Any, oracle: OracleRecognizer | None, max_s: float) -> None:
        self.ws, self.oracle = ws, oracle
        self.rec = Recording(np.zeros(int(max_s * RATE), np.int16))
        self.sent = 0  # samples of the timeline sent
        self.placed = 0  # the timeline holds utterances up to here
        self.clock = PlaybackClock(OUT_RATE)
        self.rx = np.zeros(int(max_s * OUT_RATE), np.int16)  # agent audio received (not dropped), in order
        self.rx_n = 0
        self.played = 0
        self.open_responses: set[str] = set()
        self.cancelled: set[str] = set()
        self.first_audio: dict[str, float] = {}
        self._t0 = 0.0
        self._news = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def run(self, turns: list[SpokenTurn], turn_timeout_s: float = 30.0) -> Recording:
        self._t0 = time.monotonic()
        sender = asyncio.create_task(self._send())
        reader = asyncio.create_task(self._read())
        try:
            for turn in turns:
                await self._direct(turn, turn_timeout_s)
            await self._quiet(1.0, 15.0)
        finally:
            self.rec.seconds = self.now()
            sender.cancel()
            reader.cancel()
            for task in (sender, reader):
                with contextlib.suppress(asyncio.CancelledError, Exception):  # the socket may be gone
                    await task
        return self.rec

    # -- the script ---------------------------------------------------------------------------------
    def _place(self, parts: tuple[tuple[float, Utterance, bool], ...], kind: str) -> tuple[int, int]:
        """Put a turn's utterances on the timeline right after what was sent; (start, end) samples."""
        pos = max(self.sent + 2 * TICK, self.placed)
        start = None
        for gap, utt, pause in parts:
            if start is not None and pause:
                self.rec.marks.append({"kind": "pause", "s0": pos, "s1": pos + int(gap * RATE)})
            pos += int(gap * RATE) if start is not None else 0
            start = pos if start is None else start
            n = min(len(utt.samples), len(self.rec.user) - pos)
            self.rec.user[pos:pos + n] = utt.samples[:n]
            if self.oracle is not None:
                self.oracle.place(pos, utt.words)
            pos += n
        self.placed = pos
        assert start is not None
        text = " ".join(u.text for _, u, _ in parts)
        self.rec.marks.append({"kind": "speech", "what": kind, "s0": start, "s1": pos, "text": text})
        return start, pos

    async def _direct(self, turn: SpokenTurn, timeout: float) -> None:
        await self._quiet(0.6, timeout)
        _start, end = self._place(turn.parts, "turn")
        await self._until(lambda: self.sent > end, timeout)
        self.rec.marks.append({"kind": "turn_end", "s": end, "turn": turn.kind, "answer": turn.answer})
        end_t = self.rec.wall(end)
        if turn.kind in ("barge_in", "backchannel") and turn.interruption:
            rid = await self._first_reply_audio(end_t, timeout)
            if rid is None:
                return
            await asyncio.sleep(turn.interrupt_after_s or 0.5)
            start, stop = self._place(turn.interruption, turn.kind)
            await self._until(lambda: self.sent > start, timeout)
            audible = self.clock.audible(self.now())  # the agent's audio plays as the user starts
            self.rec.marks.append({"kind": "interruption", "what": turn.kind, "s": start, "s_end": stop,
                                   "audible": audible, "response_id": rid})
            await self._until(lambda: self.sent > stop, timeout)
            if turn.kind == "barge_in":
                self.rec.marks.append({"kind": "turn_end", "s": stop, "turn": "barge_in_request", "answer": None})
        await self._quiet(0.8, timeout)

    async def _first_reply_audio(self, after: float, timeout: float) -> str | None:
        deadline = self.now() + timeout
        while self.now() < deadline:
            for rid, t in self.first_audio.items():
                if t >= after:
                    return rid
            await self._wait_news(deadline)
        return None

    async def _quiet(self, for_s: float, timeout: float) -> None:
        """Until the agent has been silent (nothing open, nothing audible) for ``for_s``."""
        deadline, since = self.now() + timeout, None
        while self.now() < deadline:
            quiet = not self.open_responses and not self.clock.audible(self.now())
            since = (since or self.now()) if quiet else None
            if since is not None and self.now() - since >= for_s:
                return
            await asyncio.sleep(0.02)

    async def _until(self, pred, timeout: float) -> None:
        deadline = self.now() + timeout
        while not pred() and self.now() < deadline:
            await asyncio.sleep(0.01)

    async def _wait_news(self, deadline: float) -> None:
        self._news.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._news.wait(), max(0.001, deadline - self.now()))

    # -- the sender and the reader ---------------------------------------------------------------------
    async def _send(self) -> None:
        while True:
            chunk = self.rec.user[self.sent:self.sent + TICK]
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(chunk.astype("<i2").tobytes()).decode()}))
            self.rec.sent_t.append(self.now())
            self.sent += TICK
            self._play(self.now())
            await asyncio.sleep(max(0.0, self._t0 + self.sent / RATE - time.monotonic()))

    def _play(self, t: float) -> None:
        pos = self.clock.position(t)
        if pos > self.played:
            self.rec.agent.append((t - (pos - self.played) / OUT_RATE, self.rx[self.played:pos].copy()))
            self.played = pos

    async def _read(self) -> None:
        async for raw in self.ws:
            ev = json.loads(raw)
            t = self.now()
            kind = ev["type"]
            if kind == "response.output_audio.delta":
                rid = ev["response_id"]
                if rid not in self.cancelled:
                    pcm = np.frombuffer(base64.b64decode(ev["delta"]), dtype="<i2").astype(np.int16)
                    self._play(t)
                    n = min(len(pcm), len(self.rx) - self.rx_n)
                    self.rx[self.rx_n:self.rx_n + n] = pcm[:n]
                    self.rx_n += n
                    self.clock.send(n, t)
                    self.first_audio.setdefault(rid, t)
                ev = {"type": kind, "response_id": rid, "samples": len(ev["delta"]) * 3 // 8}
            elif kind == "response.created":
                self.open_responses.add(ev["response"]["id"])
            elif kind == "response.done":
                rid = ev["response"]["id"]
                self.open_responses.discard(rid)
                if ev["response"]["status"] == "cancelled":
                    self.cancelled.add(rid)
                    self._stop(t, "cancelled")
            elif kind == "input.turn" and ev["kind"] == "hold":
                self._play(t)
                if self.clock.audible(t):
                    self.rec.stops.append((t, "hold"))
                self.clock.pause(t)
            elif kind == "input.turn" and ev["kind"] == "resume":
                self._play(t)
                self.clock.resume(t)
                self.rec.resumes.append(t)
            self.rec.events.append((t, ev))
            self._news.set()

    def _stop(self, t: float, why: str) -> None:
        self._play(t)
        if self.clock.audible(t) and not self.clock.paused:
            self.rec.stops.append((t, why))
        pos = self.clock.clear(t)
        self.rx_n = pos
        self.played = min(self.played, pos)
