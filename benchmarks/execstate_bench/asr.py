"""``execstate bench asr``: word error rate of the recognizers on a held-out spoken set.

The set: ``SENTENCES`` (12 everyday requests, none of them the demo's phrases or its
vocabulary's templates) spoken by eSpeak NG in ``VOICES`` (4) at ``RATES`` (2 speeds: 140 and 185
words a minute): 96 utterances, each with 0.3 s of silence around it, fed to a fresh stream of
each recognizer in 40 ms chunks (as the server does). Recognizers (``RECOGNIZERS``):

- ``pocketsphinx``: PocketSphinx's general English model (the server's default until now);
- ``pocketsphinx-demo``: PocketSphinx with the demo's phrase language model (``--voice-asr-phrases
  demo``, what the README recommended): in-domain only, so out-of-domain requests come out as
  demo words;
- ``moonshine``: Moonshine base (``voice/moonshine_asr.py``; punctuates, the punctuation is
  dropped for scoring).

WER = word edits / reference words over the set, after lower-casing, dropping punctuation and
writing numbers as digits (``voice_metrics.norm``). Also per voice and per speed, and the CPU
seconds per audio second of each recognizer.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from execstate_bench.machine import cpu_name, loadavg_1m
from execstate_bench.voice_metrics import edit_distance, norm

SENTENCES = [
    "can you remind me to call my sister at six tonight",
    "how far is the nearest train station from here",
    "what should I cook for dinner with rice and beans",
    "please turn the music down a little bit",
    "is it going to rain tomorrow morning",
    "my flight leaves at seven forty five on friday",
    "how many days are there until the end of march",
    "could you spell the word necessary for me",
    "I would like to book a table for four people",
    "what time does the library close on sunday",
    "tell me a joke about a penguin and a bicycle",
    "add milk eggs and bread to my shopping list",
]
VOICES = ("en-us", "en-us+f2", "en-us+m3", "en+f3")
RATES = (140, 185)
RECOGNIZERS = ("pocketsphinx", "pocketsphinx-demo", "moonshine")


def spoken_set(sentences: list[str] = SENTENCES) -> list[tuple[str, str, int, np.ndarray]]:
    """(sentence, voice, rate, 16 kHz audio with 0.3 s of silence around it) for every combination."""
    from execstate.voice.espeak import Espeak
    from execstate.voice.resample import resample

    pad = np.zeros(4800, np.int16)
    out = []
    for voice in VOICES:
        for rate in RATES:
            tts = Espeak(voice=voice, rate=rate)
            for s in sentences:
                x = resample(tts.speak(s)[0], tts.sample_rate, 16000)
                out.append((s, voice, rate, np.concatenate([pad, x, pad])))
    return out


def recognizer(name: str) -> Any:
    if name == "moonshine":
        from execstate.voice.moonshine_asr import Moonshine

        return Moonshine()
    from execstate.voice.pocketsphinx_asr import PocketSphinx

    if name == "pocketsphinx-demo":
        from execstate.voice.vocabulary import demo_phrases

        return PocketSphinx(demo_phrases())
    if name == "pocketsphinx":
        return PocketSphinx()
    raise ValueError(f"unknown recognizer {name!r}; one of {RECOGNIZERS}")


def transcribe(asr: Any, audio: np.ndarray, chunk: int = 640) -> str:
    s = asr.open()
    s.start(0)
    for i in range(0, len(audio), chunk):
        s.feed(audio[i:i + chunk])
    text = s.finish()
    s.close()
    return text


def _wer(rows: list[tuple[str, str]]) -> dict[str, Any]:
    errors = words = 0
    for ref, hyp in rows:
        r = norm(ref)
        errors += edit_distance(r, norm(hyp))
        words += len(r)
    return {"wer": round(errors / words, 3) if words else None, "words": words, "utterances": len(rows)}


def run_asr_bench(recognizers: tuple[str, ...] = RECOGNIZERS) -> dict[str, Any]:
    load_before = loadavg_1m()
    data = spoken_set()
    audio_s = sum(len(x) for *_, x in data) / 16000
    report: dict[str, Any] = {"bench": "asr", "machine": {"cpu": cpu_name(), "load_1m_before": load_before},
                              "set": {"sentences": len(SENTENCES), "voices": list(VOICES), "rates_wpm": list(RATES),
                                      "utterances": len(data), "audio_s": round(audio_s, 1)}, "results": {}}
    for name in recognizers:
        asr = recognizer(name)
        c0 = time.process_time()
        rows = [(s, voice, rate, transcribe(asr, x)) for s, voice, rate, x in data]
        cpu = time.process_time() - c0
        res = _wer([(s, h) for s, _, _, h in rows])
        res["by_voice"] = {v: _wer([(s, h) for s, vv, _, h in rows if vv == v])["wer"] for v in VOICES}
        res["by_rate"] = {str(r): _wer([(s, h) for s, _, rr, h in rows if rr == r])["wer"] for r in RATES}
        res["cpu_s_per_audio_s"] = round(cpu / audio_s, 3)
        res["examples"] = [{"ref": s, "hyp": h, "voice": v, "rate": r} for s, v, r, h in rows[::16]]
        report["results"][name] = res
    report["machine"]["load_1m_after"] = loadavg_1m()
    return report


def format_asr_table(r: dict[str, Any]) -> str:
    m, st = r["machine"], r["set"]
    out = [f"asr bench: {st['utterances']} utterances ({st['sentences']} sentences x {len(st['voices'])} voices x "
           f"{len(st['rates_wpm'])} speeds, {st['audio_s']} s); load {m['load_1m_before']} -> {m['load_1m_after']}",
           f"{'recognizer':20s} {'WER':>6s} " + " ".join(f"{v:>9s}" for v in st["voices"])
           + " " + " ".join(f"{str(x) + 'wpm':>7s}" for x in st["rates_wpm"]) + "  cpu s/audio s"]
    for name, res in r["results"].items():
        out.append(f"{name:20s} {res['wer']:>6.3f} " + " ".join(f"{res['by_voice'][v]:>9.3f}" for v in st["voices"])
                   + " " + " ".join(f"{res['by_rate'][str(x)]:>7.3f}" for x in st["rates_wpm"])
                   + f"  {res['cpu_s_per_audio_s']:.3f}")
    return "\n".join(out)
