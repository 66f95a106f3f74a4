"""The soak's verdict on flatness (``soak_record.verdict``), on made-up samples: RSS is flat only if
every sample after warm-up stays within 5 % of the first one after warm-up (a rise that falls back
by the end is still a miss); fds are judged on the end's mean (a sample counts the connections open
at that moment)."""

from __future__ import annotations

import pytest

from execstate_bench.soak_record import Sample, Tally, verdict


def samples(rss: list[float], fds: list[int]) -> list[Sample]:
    return [Sample(float(60 * i), r, f, 20, 0.0, 0.0, 0.0, {}, {}, {}, {}, {})
            for i, (r, f) in enumerate(zip(rss, fds, strict=True))]


def judge(rss: list[float], fds: list[int] | None = None) -> dict:
    s = samples(rss, fds or [20] * len(rss))
    return verdict(s, Tally(), warmup_s=120.0, end_s=s[-1].t, leaked_blocks=0, injected=[])


def test_rss_within_five_percent_everywhere_after_warmup_is_flat() -> None:
    # the warm-up's own growth (samples at 0 and 60 s) does not count
    v = judge([500, 800, 1000, 1030, 990, 1040, 1020, 1010, 1000, 1005, 1010, 1000])["rss"]
    assert v["met"] and v["after_warmup"] == 1000 and v["max"] == 1040 and v["max_deviation"] == pytest.approx(0.04)


def test_a_rise_that_falls_back_is_not_flat() -> None:
    v = judge([500, 800, 1000, 1020, 1080, 1060, 1010, 1000, 1000, 1000, 1000, 1000])["rss"]
    assert v["change"] == 0.0  # the end alone would pass
    assert not v["met"] and v["max_deviation"] == pytest.approx(0.08) and v["max"] == 1080


def test_a_fall_counts_as_a_deviation_too() -> None:
    v = judge([500, 800, 1000, 1000, 900, 1000, 1000, 1000, 1000, 1000, 1000, 1000])["rss"]
    assert not v["met"] and v["max_deviation"] == pytest.approx(-0.1) and v["min"] == 900


def test_fds_are_judged_on_the_end_and_report_their_swing() -> None:
    v = judge([1000] * 12, fds=[18, 19, 20, 24, 20, 21, 20, 20, 20, 20, 20, 20])["fds"]
    assert v["met"] and v["end"] == 20 and v["max_deviation"] == pytest.approx(0.2)
    v = judge([1000] * 12, fds=[18, 19, 20, 20, 21, 22, 23, 24, 25, 26, 27, 28])["fds"]
    assert not v["met"] and v["end"] == 28


def test_the_server_logs_errors_come_before_its_warnings() -> None:
    """A fault makes many warnings; the one traceback of a bug must still be in the report."""
    from execstate_bench.soak import log_problems

    log = "\n".join([f"12:00:0{i} WARNING redis: timed out" for i in range(9)] + [
        "12:00:10 ERROR execstate.serve.context: a stream failed after it started",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "KeyError: 7",
        "12:00:11 INFO fine",
        "12:00:12 CRITICAL engine: dead"])
    out = log_problems(log, most=4)
    assert out[0] == "12:00:10 ERROR execstate.serve.context: a stream failed after it started"
    assert out[1] == 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nKeyError: 7'
    assert out[2] == "12:00:12 CRITICAL engine: dead"
    assert out[3] == "12:00:00 WARNING redis: timed out"
