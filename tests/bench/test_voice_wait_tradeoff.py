"""The long-silence replay of ``execstate_bench.voice_wait_tradeoff`` on a tiny synthetic run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execstate_bench.voice_wait_tradeoff import (
    Run,
    load_runs,
    offsets,
    pause_ends,
    pause_words,
    recorded_wait,
    replay_turns,
    table,
    uniform_pause_rate,
)

# A: scored over the threshold (ends on the short silence); B: under it (waited the long 1 s).
TURN_A = {"p_end": 0.9, "p_mass": 0.1, "asr_final": 0.30, "end_of_turn": 0.32, "first_audio": 0.40, "said": "A words."}
TURN_B = {"p_end": 0.1, "p_mass": 0.0, "asr_final": 0.40, "end_of_turn": 1.25, "first_audio": 1.30, "said": "B words?"}
PAUSES = [{"pause_s": 0.7, "p_end": 0.2}, {"pause_s": 0.5, "p_end": 0.6}]


def _run() -> Run:
    return Run("t#1", [dict(TURN_A), dict(TURN_B)], [dict(p) for p in PAUSES], 0.5, 1.0)


def test_offsets_and_replay_keep_the_scored_turn_and_move_the_waiting_one() -> None:
    run = _run()
    # B's own: 1.25 - 1.0; A's: its final - 0.2 + B's residual (0.25 - (0.40 - 0.2) = 0.05).
    assert [round(x, 6) for x in offsets(run)] == [0.15, 0.25]
    assert [round(x, 6) for x in replay_turns(run, 0.5)] == [0.40, 0.80]
    assert [round(x, 6) for x in replay_turns(run, 1.0)] == [0.40, 1.30]  # the recorded wait gives the recording


def test_oracle_scores_swap_which_turn_waits() -> None:
    oracle = {"A words": 0.1, "B words": 0.9}
    # A waits: 0.15 + 0.5 + its reply 0.08; B ends its final + A's end-after-final 0.02 + its reply 0.05.
    assert [round(x, 6) for x in replay_turns(_run(), 0.5, oracle)] == [0.73, 0.47]


def test_pause_ends_by_score_or_by_lasting_the_wait() -> None:
    run = _run()
    assert pause_ends(run, 0.5) == [0.5, 1.0]  # 0.7 >= 0.15 + 0.5, not >= 0.25 + 0.5; 0.6 over the threshold
    assert pause_ends(run, 0.3) == [1.0, 1.0]
    assert pause_ends(run, 0.5, {"p1": 0.95, "p2": 0.0}, ["p1", "p2."]) == [1.0, 0.0]


def test_table_and_the_recorded_wait() -> None:
    rows = table([_run()], grid=(0.5,))
    assert rows == [{"L_s": 0.5, "p99_ms": [796], "max_ms": [800], "pooled_p99_ms": 796,
                     "pauses_ended": 1.5, "pauses": 2}]
    graded = Run("g#1", [{k: v for k, v in TURN_B.items() if k != "p_mass"}], [], 0.5, 1.0)
    assert recorded_wait(graded, 0.25) == pytest.approx(0.6)  # 1.0 - 0.8 * 0.25 / 0.5
    assert recorded_wait(_run(), 0.25) == 1.0 and recorded_wait(_run(), 0.5) == 0.2
    assert (uniform_pause_rate(0.6), uniform_pause_rate(0.2), uniform_pause_rate(0.8)) == pytest.approx((0.25, 1, 0))


def test_load_runs_reads_the_bench_json(tmp_path: Path) -> None:
    report = {"workload": {"turn_detection": {"threshold": 0.5}},
              "turn_timelines_s": {"real": [dict(TURN_A, scores=[]), dict(TURN_B, scores=[])]},
              "pause_scores": {"real": PAUSES}}
    old = {"workload": {"turn_detection": {"threshold": 0.5}},
           "turn_timelines_s": {"real": [TURN_A]}, "pause_scores": {"real": []}}  # no scores: left out
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"runs": [{"report": report}, {"report": old}]}))
    (run,) = load_runs(f)
    assert (run.name, run.threshold, run.long_s, len(run.turns), len(run.pauses)) == ("r#1", 0.5, 1.0, 2, 2)


def test_pause_words_are_the_bench_script_s() -> None:
    words = pause_words(0, 3, 7)
    assert words == ["Tell me a", "I was thinking", "Tell me a long", "Tell me a long", "Quick question, what is",
                     "Tell me a long story", "Quick question, what", "Could you tell me something nice", "Tell me a"]


def test_the_wait_counted_from_the_last_speech_frame() -> None:
    run = _run()
    run.turns[1]["vad_silence"] = 0.25  # B's last speech frame 0.05 s after the end of speech
    # B: max(0.05 + 0.5, its final 0.40 + 0.02) + 0.05; at 0.3 the final binds: 0.42 + 0.05.
    assert [round(x, 6) for x in replay_turns(run, 0.5, clock="speech")] == [0.40, 0.60]
    assert [round(x, 6) for x in replay_turns(run, 0.3, clock="speech")] == [0.40, 0.47]
    # A has no vad_silence: its offset is 0; 0.7 >= 0 + 0.6 and >= 0.05 + 0.6.
    assert pause_ends(run, 0.6, clock="speech") == [1.0, 1.0]
    assert pause_ends(run, 0.66, clock="speech") == [0.5, 1.0]
