"""``execstate demo`` (``make demo``): the tour of the three workloads.

The world part runs on the shipped world model (a few seconds): fast. The whole tour needs the
embedded ``smollm2-moe`` and ``smollm2-135m`` (built on first use): slow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from execstate.demo.world import STEPS, run_world
from execstate.model.world.strip import StripRow, strip_png


def test_strip_png_places_each_frame(tmp_path: Path) -> None:
    gen = np.zeros((3, 4, 4, 3), dtype=np.uint8)
    truth = np.zeros_like(gen)
    gen[1] = (255, 0, 0)
    truth[2] = (0, 0, 255)
    path = strip_png([StripRow("t", gen, truth, ["none", "up", "left"])], tmp_path / "s.png", scale=2)
    with Image.open(path) as png:
        img = np.asarray(png.convert("RGB"))
    size, title = 4 * 2, 14
    assert img.shape[1] == 3 * (size + 2)
    assert tuple(img[title + 1, 1 * (size + 2) + 1]) == (255, 0, 0)  # generated frame 1, top row
    assert tuple(img[title + size + 1 + 1, 2 * (size + 2) + 1]) == (0, 0, 255)  # renderer frame 2, bottom row
    assert tuple(img[title + 1, 1]) == (0, 0, 0)
    with pytest.raises(ValueError, match="do not match"):
        strip_png([StripRow("t", gen, truth[:2], ["none"] * 3)], tmp_path / "x.png")


def test_world_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_world(tmp_path) is True
    out = capsys.readouterr().out
    assert "frames identical bit for bit" in out
    assert f"steps 1-{STEPS}" not in out  # two rows of four steps
    with Image.open(tmp_path / "world.png") as img:
        assert img.size == (STEPS * (48 * 4 + 2), 2 * (14 + 2 * 48 * 4 + 12 + 10))


@pytest.mark.slow
def test_demo_tour() -> None:
    proc = subprocess.run([sys.executable, "-m", "execstate", "demo"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for line in ("R3 part passed", "world part passed", "agent part passed", "demo PASSED"):
        assert line in out
    assert "The capital of France is Paris" in out and "The answer is 391." in out
