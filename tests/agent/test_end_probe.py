"""The end-of-turn probe (``agent/end_probe.py``): the shipped file, the choice between the probe
and the end tokens' mass (refused for another model), and the probe's score reaching the
speculative prefill, the listener and the speech turn policy through a model-free front that
returns fixed hidden states (and through the VAD, with a recognizer whose final is slow: where the
long wait starts)."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from agent_fakes import FakeFront
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from execstate.agent import end_probe
from execstate.agent.duplex import DuplexAgent
from execstate.agent.end_probe import EndProbe, EndProbeError
from execstate.agent.front import Speculation
from execstate.agent.prefill import SpeculativePrefill
from execstate.agent.speech_turns import Decision, SpeechTurnConfig, SpeechTurnPolicy
from execstate.voice.audio_input import AudioInput, Final, Progress, VadStart, VadStop
from execstate.voice.listener import Listener
from execstate.voice.vad import VadConfig

SHIPPED = end_probe.shipped()


def logit_state(probe: EndProbe, z: float) -> np.ndarray:
    """A hidden state on which ``probe`` gives ``sigmoid(z)``."""
    return ((z - probe.b) * probe.w / (probe.w @ probe.w)).astype(np.float32)


class HiddenFront(FakeFront):
    """The scripted front, its speculations also returning a fixed final hidden state: ``done`` after
    a turn that ends with "please", ``open`` otherwise; the end tokens' mass is the FakeFront's."""

    def __init__(self, weights_version: str | None, done: np.ndarray, open_: np.ndarray) -> None:
        super().__init__(token_delay=0.001)
        self.weights_version = weights_version
        self.done, self.open = done, open_

    async def speculate(self, input_ids: list[int], end_tokens: frozenset[int], then: int) -> Speculation:
        s = await super().speculate(input_ids, end_tokens, then)
        h = self.done if self.text.rstrip("\n").endswith("please") else self.open
        return Speculation(s.p_end, s.computed, s.cached, h)


def test_the_shipped_probe_is_smollm2_135ms_with_thresholds_chosen_on_its_training_data():
    assert SHIPPED.meta["model"] == "smollm2-135m"
    assert SHIPPED.weights_version == "ccb9d7e40692a674aee1fa07fa823875018f435990e6eaacda255eac3ab39fe1"
    assert SHIPPED.w.shape == (576,)
    assert [SHIPPED.threshold(e) for e in ("high", "medium", "auto", "low")] == [0.2, 0.5, 0.5, 0.9]
    assert (SHIPPED.meta["seed"], SHIPPED.meta["turns"], SHIPPED.meta["examples"]) == ("0", "2400", "8160")
    assert SHIPPED.meta["valid_rates_medium"] == "0.873 0.044"  # whole turns / cut turns at or above 0.5
    with pytest.raises(ValueError, match="eagerness"):
        SHIPPED.threshold("eager")


def test_the_probability_is_the_logistic_of_the_dot_product_from_the_file(tmp_path: Path):
    w = np.array([0.5, -2.0, 1.0], np.float32)
    path = tmp_path / "p.safetensors"
    save_file({"w": w, "b": np.array([0.25], np.float32)}, str(path), metadata={"weights_version": "c" * 64})
    p = EndProbe.load(path)
    h = np.array([1.0, 0.5, 3.0], np.float32)
    assert p.prob(h) == pytest.approx(1 / (1 + math.exp(-(0.5 - 1.0 + 3.0 + 0.25))), rel=1e-12)
    assert p.prob(np.array([0.0, 400.0, 0.0])) == 0.0  # no overflow far out
    assert p.prob(np.array([0.0, -400.0, 0.0])) == 1.0
    with pytest.raises(EndProbeError) as e:
        p.prob(np.zeros(4))
    assert e.value.code == "invalid"
    with pytest.raises(EndProbeError):
        p.prob(np.array([0.0, np.nan, 0.0]))


def test_a_bad_file_is_refused(tmp_path: Path):
    with pytest.raises(EndProbeError, match="invalid|No such file"):
        EndProbe.load(tmp_path / "absent.safetensors")
    path = tmp_path / "p.safetensors"
    save_file({"w": np.zeros(3, np.float32), "b": np.zeros(1, np.float32)}, str(path))
    with pytest.raises(EndProbeError, match="weights_version"):
        EndProbe.load(path)
    save_file({"w": np.zeros((2, 3), np.float32), "b": np.zeros(1, np.float32)}, str(path),
              metadata={"weights_version": "c" * 64})
    with pytest.raises(EndProbeError, match=r"\[hidden\]"):
        EndProbe.load(path)


def test_select_uses_the_probe_only_for_the_model_it_was_trained_for():
    v = SHIPPED.weights_version
    assert end_probe.select("auto", v) is SHIPPED
    assert end_probe.select("probe", v) is SHIPPED
    assert end_probe.select("mass", v) is None
    assert end_probe.select("auto", "0" * 64) is None  # another model: the end tokens' mass
    assert end_probe.select("auto", None) is None  # not an LM session
    with pytest.raises(EndProbeError) as e:
        end_probe.select("probe", "0" * 64)
    assert e.value.code == "unsupported" and "smollm2-135m" in e.value.message
    with pytest.raises(EndProbeError) as e:
        end_probe.select("probe", None)
    assert e.value.code == "unsupported"
    with pytest.raises(EndProbeError, match="end_score"):
        end_probe.select("semantic", v)


def test_an_agent_on_another_model_scores_with_the_mass_or_is_refused():
    from execstate.agent.config import AgentConfig

    other = HiddenFront("0" * 64, np.zeros(576, np.float32), np.zeros(576, np.float32))
    assert DuplexAgent(other).prefill.probe is None
    with pytest.raises(EndProbeError):
        DuplexAgent(other, config=AgentConfig(end_score="probe"))
    same = HiddenFront(SHIPPED.weights_version, np.zeros(576, np.float32), np.zeros(576, np.float32))
    assert DuplexAgent(same).prefill.probe is SHIPPED
    assert DuplexAgent(same, config=AgentConfig(end_score="mass")).prefill.probe is None
    with pytest.raises(ValueError, match="end_score"):
        AgentConfig(end_score="semantic")


def test_the_speculation_scores_with_the_probe_on_the_returned_hidden_state():
    async def main():
        front = HiddenFront(SHIPPED.weights_version, logit_state(SHIPPED, 2.0), logit_state(SHIPPED, -3.0))
        pre = SpeculativePrefill(front, frozenset({ord("\n")}), SHIPPED)
        seen: list[tuple[str, float]] = []
        pre.on_score.append(lambda text, p: seen.append((text, p)))
        pre.partial = "call my mom"
        p_open = await pre.speculate(front.prelude(), front.encode("\nUser: call my mom"), ord("\n"))
        pre.partial = "call my mom please"
        p_done = await pre.speculate(front.prelude(), front.encode("\nUser: call my mom please"), ord("\n"))
        return p_open, p_done, pre.mass, seen

    p_open, p_done, mass, seen = asyncio.run(main())
    assert p_open == pytest.approx(1 / (1 + math.exp(3.0)), abs=1e-6)
    assert p_done == pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-6)
    assert mass == 0.05  # the front's own end tokens' mass, kept beside
    assert seen == [("call my mom", p_open), ("call my mom please", p_done)]


def test_a_front_without_hidden_states_scores_with_the_mass():
    async def main():
        front = FakeFront(token_delay=0.001)
        pre = SpeculativePrefill(front, frozenset({ord("\n")}), SHIPPED)
        pre.partial = "what time is it?"
        return await pre.speculate(front.prelude(), front.encode("\nUser: what time is it?"), ord("\n"))

    assert asyncio.run(main()) == 0.9


class _Silent:
    def audible(self) -> bool:
        return False


def test_the_listener_and_the_turn_policy_take_the_probes_score():
    """A turn whose hidden state the probe scores 0.88 ends after the short silence; one it scores
    0.047 waits the long silence (no graded wait), though the end tokens' mass is the same."""

    async def one_turn(words: str) -> tuple[float, tuple[float, float | None], Decision, Decision | None]:
        front = HiddenFront(SHIPPED.weights_version, logit_state(SHIPPED, 2.0), logit_state(SHIPPED, -3.0))
        agent = DuplexAgent(front, clock=lambda: 5.0)
        assert agent.prefill.probe is SHIPPED
        turns = SpeechTurnPolicy(SpeechTurnConfig(end_threshold=SHIPPED.threshold("auto"), semantic_silence_s=0.2,
                                                  end_of_turn_silence_s=1.0, graded_wait=False))
        events: list = []
        listener = Listener(agent, _Silent(), turns, events.append, lambda: False)  # type: ignore[arg-type]
        await agent.start()
        listener.on_input(VadStart(8000, 3200))
        listener.on_input(Progress(1.0, 0.0))
        listener.on_input(VadStop(24000, 27200))
        listener.on_input(Final(words, 3200, 27200))
        while not any(e.type == "input.end_score" for e in events):
            await asyncio.sleep(0.002)
        last, deadline = turns.last_speech_t, turns.next_deadline()
        assert last is not None and deadline is not None
        score = [(e.p_end, e.p_mass) for e in events if e.type == "input.end_score"][-1]
        now = turns.on_tick(last + 0.25)  # the VAD's segment end and a little more
        later = turns.on_tick(last + 1.0) if now is Decision.NONE else None
        await agent.close()
        return deadline - last, score, now, later

    done = asyncio.run(asyncio.wait_for(one_turn("call my mom please"), 30))
    open_ = asyncio.run(asyncio.wait_for(one_turn("call my mom"), 30))
    assert done[0] == pytest.approx(0.2) and done[1] == (0.8808, 0.05) and done[2] is Decision.END_OF_TURN
    assert open_[0] == pytest.approx(1.0) and open_[1] == (0.0474, 0.05)
    assert (open_[2], open_[3]) == (Decision.NONE, Decision.END_OF_TURN)


class _Loud:
    """A speech detector that hears any frame louder than 100."""
    sample_rate, frame_samples = 16000, 512

    def probability(self, frame: np.ndarray) -> float:
        return 1.0 if np.abs(frame.astype(np.int32)).max() > 100 else 0.0

    def reset(self) -> None:
        pass


class _SlowFinal:
    """A recognizer stream that hears ``words`` and takes ``final_s`` of the clock ``now`` to give its final."""

    def __init__(self, now: list[float], words: str, final_s: float) -> None:
        self.now, self.words, self.final_s = now, words, final_s

    def start(self, at_sample: int) -> None:
        pass

    def feed(self, samples: np.ndarray) -> str | None:
        return None

    def finish(self) -> str:
        self.now[0] += self.final_s
        return self.words

    def close(self) -> None:
        pass


def test_the_long_wait_counts_from_the_last_speech_frame_not_from_the_slow_final():
    """1.0 s of speech, then silence, streamed in real time (32 ms chunks) through the VAD; the
    recognizer's final takes 0.3 s. Words the probe scores 0.047 end the turn 1.0 s (the long
    silence) after the last speech frame, not 1.0 s after the final less the VAD's 0.2 s; words it
    scores 0.88 end it once the final is in and scored (the short silence has passed)."""
    async def one_turn(words: str) -> tuple[float, float, float, float | None]:
        now = [0.0]
        front = HiddenFront(SHIPPED.weights_version, logit_state(SHIPPED, 2.0), logit_state(SHIPPED, -3.0))
        agent = DuplexAgent(front, clock=lambda: now[0])
        turns = SpeechTurnPolicy(SpeechTurnConfig(end_threshold=SHIPPED.threshold("auto"), semantic_silence_s=0.2,
                                                  end_of_turn_silence_s=1.0, graded_wait=False))
        events: list = []
        ended: list[float] = []
        listener = Listener(agent, _Silent(), turns, events.append, lambda: False,  # type: ignore[arg-type]
                            end_context=lambda: ended.append(agent.now()))
        inp = AudioInput(_Loud(), _SlowFinal(now, words, 0.3), VadConfig(), clock=agent.now)  # type: ignore[arg-type]
        await agent.start()
        tone = (1000 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.int16)
        audio = np.concatenate([tone, np.zeros(3 * 16000, dtype=np.int16)])
        stop: VadStop | None = None
        final_t: float | None = None
        for i in range(0, len(audio), 512):
            now[0] += 512 / 16000  # the chunk's last sample arrives
            for ev in inp.process(audio[i:i + 512]):
                listener.on_input(ev)
                stop = ev if isinstance(ev, VadStop) else stop
                if isinstance(ev, Final):
                    final_t = agent.now()
                    while not any(e.type == "input.end_score" for e in events):
                        await asyncio.sleep(0.002)
            listener.tick()
            if ended:
                break
        await agent.close()
        assert stop is not None and stop.speech_end_t is not None and final_t is not None and ended
        assert stop.speech_end_t == pytest.approx(stop.speech_end / 16000)  # the clock ran with the audio till then
        last_speech = stop.speech_end_t
        score = [e.p_end for e in events if e.type == "input.end_score"][-1]
        return last_speech, final_t, ended[0], score

    last, final_t, end, score = asyncio.run(asyncio.wait_for(one_turn("call my mom"), 30))
    assert score == 0.0474 and last == pytest.approx(1.024)  # the frame holding the tone's last sample ends there
    assert final_t == pytest.approx(last + 0.224 + 0.3)  # the VAD's silence (7 frames: >= 0.2 s), the slow final
    assert last + 1.0 <= end < last + 1.0 + 0.032  # the long silence from the speech (first tick after it)
    last, final_t, end, score = asyncio.run(asyncio.wait_for(one_turn("call my mom please"), 30))
    assert score == 0.8808 and last == pytest.approx(1.024)
    assert end == pytest.approx(final_t) == pytest.approx(last + 0.524)  # the short silence passed: ends with the final


def test_the_generator_never_writes_the_benchs_sentences_and_cuts_inside_its_turns():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from execstate_bench.duplex_script import NAMES, PLAIN, SUBJECTS
    from execstate_bench.end_probe_text import examples, generate

    turns = generate(400, 7)
    assert turns == generate(400, 7) and turns != generate(400, 8)
    text = [t for t, _ in examples(turns)]
    for s in [*SUBJECTS, *NAMES]:
        assert not any(f" {s} " in f" {x.lower()} " for x in text), s
    for template in [*PLAIN, "Tell me a long story about", "Quick question, what is", "Describe", "wait stop",
                     " times "]:
        assert not any(template.split("{")[0].lower().rstrip(" ,") in x.lower() for x in text), template
    for turn in turns:
        assert all(0 < k < len(turn.words) for k in turn.cuts) and (len(turn.words) < 2 or turn.cuts)
        assert turn.words[-1][-1] not in ".?!,"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=576, max_size=576), st.floats(-50, 50))
def test_the_probability_is_a_monotone_logistic_of_any_finite_state(h, shift):
    x = np.array(h, np.float32)
    p = SHIPPED.prob(x)
    z = float(x.astype(np.float64) @ SHIPPED.w) + SHIPPED.b
    assert 0.0 <= p <= 1.0 and p == pytest.approx(1 / (1 + math.exp(-min(max(z, -700), 700))), abs=1e-12)
    moved = x.astype(np.float64) + shift * SHIPPED.w / (SHIPPED.w @ SHIPPED.w)  # the logit moves by ``shift``
    q = SHIPPED.prob(moved)
    assert (q >= p) if shift >= 0 else (q <= p)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_any_seed_gives_turns_without_a_final_mark_and_negatives_that_are_their_prefixes(seed, n):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from execstate_bench.end_probe_text import examples, generate

    turns = generate(n, seed)
    ex = examples(turns)
    assert len(turns) == n and sum(lbl for _, lbl in ex) == n
    for t in turns:
        whole = " ".join(t.words)
        assert whole and whole[-1] not in ".?!,"
        for k in t.cuts:
            cut = " ".join(t.words[:k]).rstrip(".,")
            assert (cut, 0) in ex and whole.startswith(cut) and len(cut) < len(whole)
