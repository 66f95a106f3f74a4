"""The default speech detector: Silero VAD's ONNX model in onnxruntime.

The ``silero-vad`` wheel ships the model file; it is located without importing the package
(whose import pulls torch), so the wheel can be installed ``--no-deps`` (``make setup`` does:
a plain install would pull a CUDA torch). 512 samples (32 ms) at 16 kHz per call, with the 64
samples before them as context, and the recurrent state carried across calls
(``SpeechDetector`` contract in ``interfaces.py``). About 0.15 ms per frame on one thread.

The model is stateless (the recurrent state is an input and an output of each call), so one
:class:`SileroModel` (the onnxruntime session: a few MB and its arena) serves every detector of a
server; each :class:`SileroVAD` keeps only its own state. ``SileroVAD()`` without a model builds
a private one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

MODEL_FILE = "silero_vad.onnx"


def model_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Silero VAD needs the silero-vad package (pip install --no-deps silero-vad; "
                           "its torch requirement is not needed: the ONNX model runs in onnxruntime)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / MODEL_FILE
    if not path.is_file():
        raise RuntimeError(f"silero-vad is installed but {path} is missing")
    return path


class SileroModel:
    """The ONNX session, shared by detectors (onnxruntime runs concurrent calls of one session)."""

    def __init__(self, path: str | Path | None = None) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(path or model_path()), sess_options=opts,
                                                    providers=["CPUExecutionProvider"])


class SileroVAD:
    sample_rate = 16000
    frame_samples = 512
    context_samples = 64

    def __init__(self, model: SileroModel | None = None) -> None:
        self._session = (model or SileroModel()).session
        self._sr = np.array(self.sample_rate, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(self.context_samples, dtype=np.float32)

    def probability(self, frame: np.ndarray) -> float:
        if frame.shape != (self.frame_samples,):
            raise ValueError(f"a frame is {self.frame_samples} samples, got shape {frame.shape}")
        x = frame.astype(np.float32) / 32768.0
        inp = np.concatenate([self._context, x])[None, :]
        out, self._state = self._session.run(None, {"input": inp, "state": self._state, "sr": self._sr})
        self._context = x[-self.context_samples:]
        return float(out[0, 0])
