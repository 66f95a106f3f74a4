"""Speech out for a duplex agent with espeak-ng: the runtime is unchanged, only the consumer of its
events differs (text deltas -> audio), and the playback position goes back as ``truncate``.

    python examples/agent_speech_out.py [--out agent_speech]     # needs the espeak-ng binary

Each response's text is spoken phrase by phrase (``espeak-ng --stdout``, in a worker thread) and
"played" in real time (the WAVs are written to ``--out``; a real client would send them to a
speaker). Audio outlasts generation, so an interruption while the answer *plays* is the client's
call, as in the OpenAI Realtime API: it stops playback, cancels the response if it is still being
generated (``agent.cancel()``) and reports what was actually played with
``agent.truncate(item, played_chars=...)`` (only phrases whose audio finished), so the front's
context keeps exactly what the user heard; then the user's words are fed as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import shutil
import subprocess
import wave
from pathlib import Path

from execstate.agent.config import AgentConfig
from execstate.agent.duplex import DuplexAgent
from execstate.agent.front import SessionFront
from execstate.engine.async_engine import AsyncEngine
from execstate.engine.config import EngineConfig
from execstate.engine.llm_engine import LLMEngine
from execstate.engine.sampling_params import SamplingParams
from execstate.model import registry

SYSTEM = "<|im_start|>system\nYou are a friendly voice assistant.<|im_end|>"
CHAT = {"user_prefix": "\n<|im_start|>user\n", "agent_prefix": "<|im_end|>\n<|im_start|>assistant\n"}


def speak(text: str) -> tuple[bytes, float]:
    """WAV bytes and their duration (s) for ``text``."""
    wav = subprocess.run(["espeak-ng", "--stdout", "-s", "170", text], check=True, capture_output=True).stdout
    with wave.open(io.BytesIO(wav)) as w:  # on stdout the header's length is a placeholder: use the bytes
        per_second = w.getframerate() * w.getsampwidth() * w.getnchannels()
    return wav, max(len(wav) - 44, 0) / per_second


class SpeechOut:
    """Plays each response's phrases in order; knows how many characters were played."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.played: dict[str, int] = {}  # response id -> characters whose audio finished
        self.pending: dict[str, str] = {}
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.stopped: set[str] = set()
        self.current: str | None = None  # the response being played
        self.playing = False

    def on_delta(self, rid: str, text: str, final: bool = False) -> None:
        buf = self.pending.get(rid, "") + text
        parts = re.split(r"(?<=[.,!?;:])", buf)
        done, rest = (parts, "") if final else (parts[:-1], parts[-1])
        for p in done:
            if p.strip():
                self.queue.put_nowait((rid, p))
        self.pending[rid] = rest

    async def run(self) -> None:
        n = 0
        while True:
            rid, phrase = await self.queue.get()
            if rid in self.stopped:
                continue
            self.playing = True
            wav, seconds = await asyncio.to_thread(speak, phrase)
            self.current = rid
            n += 1
            (self.out / f"{n:03d}-{rid}.wav").write_bytes(wav)
            await asyncio.sleep(seconds)  # playing
            self.playing = False
            if rid not in self.stopped:
                self.played[rid] = self.played.get(rid, 0) + len(phrase)
                print(f"  [played {seconds:.1f} s] {phrase.strip()!r}")


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eng = AsyncEngine(LLMEngine(EngineConfig(model=str(registry.prepare("smollm2-135m")), seed=0)))
    front = await SessionFront.open(eng, SYSTEM, SamplingParams(temperature=0.0, max_tokens=4))
    agent = DuplexAgent(front, config=AgentConfig(max_response_tokens=24, **CHAT))
    speech = SpeechOut(out)
    player = asyncio.create_task(speech.run())
    await agent.start()

    async def consume() -> None:
        async for e in agent.events():
            if e.type == "response.output_text.delta":
                speech.on_delta(e.response_id, e.text)
            elif e.type == "response.done":
                print(f"{e.t:5.2f}s response.done {e.response_id} {e.status}: {e.text!r}")
                speech.on_delta(e.response_id, "", final=True)
            elif e.type == "input.turn":
                print(f"{e.t:5.2f}s {e.kind}: {e.text!r}")

    consumer = asyncio.create_task(consume())
    agent.feed("Hello! Who are you?")
    await asyncio.sleep(1)
    while agent.fence.active or speech.playing or not speech.queue.empty():  # the user listens to the end
        await asyncio.sleep(0.1)
    agent.feed("What do you know about the sea?")
    first = speech.current
    while speech.current == first:  # the second answer starts playing
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.5)
    rid = speech.current  # the user speaks while this answer plays
    if rid is not None:
        speech.stopped.update(agent.fence.responses)  # stop playing, drop what is queued
        agent.cancel()  # False if its generation already ended
        played = speech.played.get(rid, 0)
        kept = agent.truncate(rid, played_chars=played)
        heard = agent.fence.responses[rid].emitted_text[:played]
        print(f"  interrupted {rid}: context cut to the {played} characters heard ({kept} tokens): {heard!r}")
    agent.feed("sorry, stop, tell me about trains")
    await asyncio.sleep(8)
    await agent.close()
    await consumer
    player.cancel()
    eng.shutdown()
    print(f"WAV files in {out}/")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="agent_speech")
    args = ap.parse_args()
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (apt-get install espeak-ng)")
    asyncio.run(main(Path(args.out)))
