"""The bench's spoken conversations stored once and read back, so that runs hear the same audio.

eSpeak NG's output differs from one synthesis of a text to the next (its state carries between
syntheses; ``espeak_ng_SetRandSeed`` does not fix it: docs/voice.md), so two runs of ``execstate
bench voice`` that synthesise their conversations feed the recognizer different audio.
:func:`save` writes the conversations (every utterance's samples, words, gaps) to one ``.npz``
(no pickles: a JSON index, then one int16 array per utterance) with the workload they were made
for (seed, turns, voices, rate); :func:`load` reads them back and refuses a file made for another
workload; :func:`workload_of` says which workload a file was made for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from execstate_bench.voice_script import SpokenTurn, Utterance

Parts = tuple[tuple[float, Utterance, bool], ...]


def save(path: str | Path, scripts: list[list[SpokenTurn]], workload: dict[str, Any]) -> None:
    arrays: list[np.ndarray] = []  # the utterances: "arr_1", "arr_2"... in the file ("arr_0": the index)

    def parts(ps: Parts) -> list[list[Any]]:
        out = []
        for gap, u, pause in ps:
            arrays.append(u.samples)
            key = f"arr_{len(arrays)}"
            out.append([gap, pause, u.text, key, [list(w) for w in u.words]])
        return out

    index = {"workload": workload, "conversations": [
        [{"kind": t.kind, "answer": t.answer, "interrupt_after_s": t.interrupt_after_s,
          "parts": parts(t.parts), "interruption": parts(t.interruption)} for t in conv] for conv in scripts]}
    with open(path, "wb") as f:
        np.savez(f, np.array(json.dumps(index)), *arrays)


def workload_of(path: str | Path) -> dict[str, Any]:
    """The workload the conversations at ``path`` were made for."""
    with np.load(path, allow_pickle=False) as f:
        workload: dict[str, Any] = json.loads(str(f["arr_0"]))["workload"]
        return workload


def load(path: str | Path, workload: dict[str, Any]) -> list[list[SpokenTurn]]:
    """The conversations stored at ``path``; ValueError when they were made for another workload."""
    with np.load(path, allow_pickle=False) as f:
        index = json.loads(str(f["arr_0"]))
        if index["workload"] != workload:
            raise ValueError(f"{path} holds the conversations of {index['workload']}, not of {workload}")

        def parts(ps: list[list[Any]]) -> Parts:
            return tuple((gap, Utterance(text, f[key], tuple((int(s), int(e), str(w)) for s, e, w in words)), pause)
                         for gap, pause, text, key, words in ps)

        return [[SpokenTurn(t["kind"], parts(t["parts"]), t["answer"], t["interrupt_after_s"],
                            parts(t["interruption"])) for t in conv] for conv in index["conversations"]]
