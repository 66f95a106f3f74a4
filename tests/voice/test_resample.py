"""The streaming resampler: sample counts, chunking invariance, accuracy on a tone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.voice.resample import Resampler, resample

PAIRS = [(22050, 16000), (24000, 16000), (16000, 24000), (44100, 16000), (48000, 16000), (22050, 24000)]


def tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(0.5 * np.sin(2 * np.pi * hz * t) * 32767).astype(np.int16)


@pytest.mark.parametrize("a,b", PAIRS)
def test_count_and_accuracy(a: int, b: int) -> None:
    x = tone(a, 0.5)
    y = resample(x, a, b)
    assert len(y) == -(-len(x) * b // a)
    ref = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(y)) / b) * 32767
    err = np.abs(y[64:-64].astype(np.float64) - ref[64:-64]).max()
    assert err < 8  # a few LSB on a half-scale tone: the passband is flat and in phase


def test_stopband() -> None:
    """A 10 kHz tone at 48 kHz is above the 8 kHz Nyquist of 16 kHz: it is filtered out."""
    y = resample(tone(48000, 0.5, 10_000), 48000, 16000)
    assert np.abs(y[64:-64]).max() < 0.01 * 16384


def test_equal_rates_pass_through() -> None:
    x = tone(16000, 0.1)
    r = Resampler(16000, 16000)
    assert np.array_equal(r.process(x), x) and len(r.flush()) == 0


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(PAIRS), st.lists(st.integers(1, 900), min_size=1, max_size=12), st.integers(0, 2**31 - 1))
def test_chunking_does_not_change_output(pair, sizes, seed) -> None:
    a, b = pair
    x = np.random.default_rng(seed).integers(-20000, 20000, sum(sizes)).astype(np.int16)
    whole = resample(x, a, b)
    r, parts, i = Resampler(a, b), [], 0
    for n in sizes:
        parts.append(r.process(x[i:i + n]))
        i += n
    parts.append(r.flush())
    assert np.array_equal(np.concatenate(parts), whole)


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        Resampler(0, 16000)
    r = Resampler(24000, 16000)
    with pytest.raises(ValueError):
        r.process(np.zeros((2, 4), np.int16))
    r.flush()
    with pytest.raises(ValueError):
        r.process(np.zeros(4, np.int16))
