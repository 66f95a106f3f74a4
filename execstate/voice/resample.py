"""Streaming sample-rate conversion (numpy only): a polyphase windowed-sinc filter.

``Resampler(in_rate, out_rate)`` converts a stream fed in chunks of any size: ``process(chunk)``
returns the output samples it can compute so far, ``flush()`` the rest (the tail, as if zeros
followed). Contracts the tests check:

- Chunking does not change the output: any split of the input gives the same samples, bit for bit
  (each output sample is one dot product over the same inputs, in the same order).
- ``N`` input samples give ``ceil(N * out_rate / in_rate)`` output samples after ``flush`` (output
  ``n`` sits at input time ``n * in_rate / out_rate``, zero phase: no delay in the signal).
- Equal rates pass the samples through unchanged.

The filter is a Kaiser-windowed sinc with its cut-off at ``rolloff`` of the lower Nyquist
frequency, ``taps`` input samples wide at the input rate (wider when decimating, so the
cut-off scales). Lookahead: ``taps / 2`` input samples (16 taps at 16 kHz: 0.5 ms).
Pure CPU work: callers on an event loop run it in a worker thread.
"""

from __future__ import annotations

import math

import numpy as np

from execstate.voice.pcm import to_int16


class Resampler:
    def __init__(self, in_rate: int, out_rate: int, taps: int = 16, rolloff: float = 0.94, beta: float = 8.0) -> None:
        for name, v in (("in_rate", in_rate), ("out_rate", out_rate), ("taps", taps)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.in_rate, self.out_rate = in_rate, out_rate
        g = math.gcd(in_rate, out_rate)
        self.up, self.down = out_rate // g, in_rate // g
        scale = min(1.0, out_rate / in_rate)
        self.width = 2 * math.ceil(taps / scale / 2)  # input samples each output sample reads (even)
        half = self.width // 2
        fc = 0.5 * scale * rolloff  # cycles per input sample
        phases = np.arange(self.up, dtype=np.float64)[:, None] / self.up
        d = phases + (half - 1) - np.arange(self.width, dtype=np.float64)[None, :]  # output time - input time
        window = np.kaiser(2 * half + 1, beta)
        wpos = np.clip(d + half, 0, 2 * half)
        taper = np.interp(wpos, np.arange(2 * half + 1), window)
        self._bank = (2 * fc * np.sinc(2 * fc * d) * taper).astype(np.float64)
        self._bank /= self._bank.sum(axis=1, keepdims=True)  # unit DC gain in every phase
        self._buf = np.zeros(half - 1, dtype=np.float64)  # history: zeros before the stream
        self._buf0 = -(half - 1)  # absolute input index of _buf[0]
        self._n = 0  # next output sample
        self._fed = 0  # input samples fed
        self._flushed = False

    @property
    def passthrough(self) -> bool:
        return self.up == self.down

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """int16 (or float in [-1, 1]) samples in -> int16 samples out (what can be computed now)."""
        if self._flushed:
            raise ValueError("the resampler was flushed; make a new one")
        x = np.asarray(chunk)
        if x.ndim != 1:
            raise ValueError(f"mono audio only: expected a 1-D array, got shape {x.shape}")
        if self.passthrough:
            self._fed += len(x)
            return x.astype(np.int16) if x.dtype == np.int16 else to_int16(x)
        xf = x.astype(np.float64) / (32768.0 if x.dtype == np.int16 else 1.0)
        self._buf = np.concatenate([self._buf, xf])
        self._fed += len(x)
        return self._emit(limit=None)

    def flush(self) -> np.ndarray:
        """The remaining output (the stream ended: zeros follow)."""
        if self.passthrough or self._flushed:
            self._flushed = True
            return np.zeros(0, dtype=np.int16)
        self._flushed = True
        self._buf = np.concatenate([self._buf, np.zeros(self.width, dtype=np.float64)])
        return self._emit(limit=-(-self._fed * self.up // self.down))

    def _emit(self, limit: int | None) -> np.ndarray:
        half = self.width // 2
        end = self._buf0 + len(self._buf)  # absolute index one past the last buffered input
        # output n reads inputs base-half+1 .. base+half, base = floor(n * down / up)
        # every n with floor(n * down / up) + half < end, i.e. n * down < (end - half) * up
        n_stop = -(-(end - half) * self.up // self.down) if end - half > 0 else 0
        if limit is not None:
            n_stop = min(n_stop, limit)
        if n_stop <= self._n:
            return np.zeros(0, dtype=np.int16)
        n = np.arange(self._n, n_stop, dtype=np.int64)
        base = (n * self.down) // self.up
        phase = (n * self.down) % self.up
        idx = (base - half + 1 - self._buf0)[:, None] + np.arange(self.width)[None, :]
        y = np.einsum("ij,ij->i", self._buf[idx], self._bank[phase])
        self._n = n_stop
        keep_from = (n_stop * self.down) // self.up - half + 1  # the next output's first input
        drop = max(0, keep_from - self._buf0)
        self._buf, self._buf0 = self._buf[drop:], self._buf0 + drop
        return to_int16(y)


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Convert a whole signal (int16 out)."""
    r = Resampler(in_rate, out_rate)
    return np.concatenate([r.process(samples), r.flush()])
