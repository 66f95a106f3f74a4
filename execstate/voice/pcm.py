"""PCM16 helpers: bytes <-> int16 arrays, float conversion, WAV files, durations.

Every audio array in ``voice/`` is mono ``np.int16`` (little-endian PCM16 on the wire); a sample
rate always travels beside it. Conversions validate before they touch the bytes.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def pcm16_from_bytes(data: bytes) -> np.ndarray:
    """Little-endian PCM16 bytes -> int16 array (ValueError on an odd byte count)."""
    if len(data) % 2:
        raise ValueError(f"PCM16 audio must have an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.int16, copy=False)


def pcm16_to_bytes(samples: np.ndarray) -> bytes:
    return np.asarray(samples, dtype="<i2").tobytes()


def to_float(samples: np.ndarray) -> np.ndarray:
    """int16 -> float32 in [-1, 1)."""
    return np.asarray(samples, dtype=np.float32) / 32768.0


def to_int16(samples: np.ndarray) -> np.ndarray:
    """float in [-1, 1] (clipped) -> int16, rounded."""
    return np.clip(np.rint(np.asarray(samples, dtype=np.float64) * 32768.0), -32768, 32767).astype(np.int16)


def ms(samples: int, rate: int) -> float:
    return samples * 1000.0 / rate


def samples_for_ms(milliseconds: float, rate: int) -> int:
    return int(round(milliseconds * rate / 1000.0))


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """A mono or stereo PCM16 WAV file -> (mono int16 samples, rate); stereo is averaged."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is read, got {8 * w.getsampwidth()}-bit")
        rate, channels = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1).round().astype(np.int16)
    return x.astype(np.int16, copy=False), rate


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16_to_bytes(samples))


def rms_dbfs(samples: np.ndarray) -> float:
    """Root-mean-square level in dB relative to full scale (-inf for silence)."""
    x = to_float(samples).astype(np.float64)
    if x.size == 0:
        return float("-inf")
    r = float(np.sqrt(np.mean(x * x)))
    return 20 * np.log10(r) if r > 0 else float("-inf")
