"""``make setup`` shows progress: each install is a step of ``scripts/setup_step.py``, which prints a
line when the step starts, a progress line while it runs (counted from pip's output, which goes to a
log file, not the terminal) and its time when it ends, and on a failure the output's last lines and
the command's exit status."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("setup_step", REPO / "scripts" / "setup_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKE_PIP = """
import sys, time
for name in ("alpha", "beta", "gamma"):
    print(f"Collecting {name}>=1")
    print(f"  Downloading {name}-1.0-py3-none-any.whl (10 kB)", flush=True)
print("Processing /opt/wheels/delta-1.0-py3-none-any.whl (from alpha)", flush=True)
time.sleep(0.6)
print("Installing collected packages: delta, alpha, beta, gamma", flush=True)
time.sleep(0.3)
print("Successfully installed alpha-1.0 beta-1.0 delta-1.0 gamma-1.0")
sys.exit(int(sys.argv[1]))
"""


def test_a_step_prints_its_progress_not_pips_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "setup.log"
    status = _script().main(["--log", str(log), "--every", "0.2", "2/5 the packages", "--",
                             sys.executable, "-c", FAKE_PIP, "0"])
    assert status == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "setup [2/5 the packages] ..."
    ticks = [line for line in out[1:-1] if line.startswith("  ... ")]
    assert len(ticks) >= 3 and len(ticks) == len(out) - 2
    assert any(t.endswith(": 4 packages collected, 3 downloaded") for t in ticks)
    assert re.fullmatch(r"  done in \d+ s \(4 packages collected, 3 downloaded, installing 4\)", out[-1])
    assert not any("Collecting" in line for line in out)  # pip's lines are in the log only
    text = log.read_text()
    assert "Collecting gamma>=1" in text and "Successfully installed" in text and text.count("$ ") == 1


def test_a_failed_step_shows_the_output_and_returns_the_status(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "setup.log"
    log.write_text("an earlier step's output\n")
    status = _script().main(["--log", str(log), "--every", "5", "1/1 x", "--", sys.executable, "-c", FAKE_PIP, "3"])
    assert status == 3
    err = capsys.readouterr().err
    assert "Successfully installed alpha-1.0" in err and "an earlier step's output" not in err
    assert "setup [1/1 x] failed (exit status 3) after" in err and str(log) in err


def test_makefile_runs_every_install_as_a_step_without_q() -> None:
    """Every ``pip install`` of the set-up is a step (progress), none of them ``-q`` (silent)."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    recipe = re.split(r"\$\(STAMP\):[^\n]*\n", text, maxsplit=1)[1].split("\n\n", 1)[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert len(installs) == 6
    for line in installs:
        assert line.lstrip().startswith("@$(SETUP_STEP) "), line
        assert " -q " not in line, line
    steps = [re.search(r'"(\d)/(\d) ', line).groups() for line in installs]
    assert steps == [(str(i), "6") for i in range(1, 7)]
