"""``execstate bench builds``: extension builds loaded side by side in one process, their results
checked against the baseline's before any time counts."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from execstate.kernels import ext
from execstate.model.random_models import make_random
from execstate_bench import build_ab
from execstate_bench.build_ab import BuildMismatch, load_build, run_moe_ab, run_prefill_ab, summarize

pytestmark = pytest.mark.skipif(not ext.available() or not ext.lib().packed_available(),
                                reason="needs the extension's AVX-512 packed kernels")


@pytest.fixture()
def two_builds(tmp_path: Path) -> list[Path]:
    """Two copies of the installed build, as two files (loaded as two modules)."""
    src = Path(ext._cpu.__file__)
    out = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        out.append(Path(shutil.copy(src, tmp_path / name / src.name)))
    return out


def test_summarize_pairs_each_round_with_the_baseline() -> None:
    rows = summarize(["base", "new"], [[1.0, 2.0, 4.0], [0.9, 2.2, 3.6]], flop=1e9)
    assert [r["build"] for r in rows] == ["base", "new"]
    assert rows[0]["paired_ratio"] == 1.0
    assert rows[1]["paired_ratio"] == pytest.approx(0.9)  # median of 0.9, 1.1, 0.9
    assert rows[1]["median_s"] == 2.2 and rows[1]["min_s"] == 0.9
    assert rows[0]["gflops"] == pytest.approx(0.5)


def test_moe_of_two_copies_of_one_build(two_builds: list[Path]) -> None:
    report = run_moe_ab(two_builds, tokens=96, rounds=2, calls=1)
    assert report["workload"] == "moe" and report["tokens"] == 96
    names = [str(p) for p in two_builds]
    assert [r["build"] for r in report["builds"]] == names + [f"{names[0]} (A/A control)"]
    assert len(run_moe_ab(two_builds, tokens=96, rounds=1, calls=1, control=False)["builds"]) == 2
    assert report["builds"][0]["paired_ratio"] == 1.0
    for r in report["builds"]:
        assert r["min_s"] > 0 and r["min_s"] <= r["median_s"] and r["gflops"] > 0


def test_a_build_whose_moe_differs_is_refused(two_builds: list[Path], monkeypatch) -> None:
    real = build_ab.load_build

    def load(path: Path, index: int):
        m = real(path, index)
        if index != 1:
            return m

        def moe_packed(*args):  # the second build (index 1): its first output element off by one
            m.moe_packed(*args)
            first = ctypes.c_float.from_address(args[5])  # args[5]: out's data pointer
            first.value += 1.0

        return SimpleNamespace(moe_packed=moe_packed)

    monkeypatch.setattr(build_ab, "load_build", load)
    with pytest.raises(BuildMismatch, match="differs"):
        run_moe_ab(two_builds, tokens=96, rounds=1, calls=1)


def test_prefill_of_two_copies_of_one_build(two_builds: list[Path], tmp_path: Path) -> None:
    model = make_random("qwen3_moe", tmp_path / "model", seed=0)
    before = ext._cpu
    report = run_prefill_ab(two_builds, model, rounds=1, calls=1, prompt_len=64)
    assert ext._cpu is before  # the engine's own module is back
    assert report["workload"] == "prefill" and report["prompts"] == "8 x 64" and len(report["builds"]) == 3
    assert report["builds"][0]["paired_ratio"] == 1.0 and report["builds"][1]["min_s"] > 0


def test_bad_builds_are_named(tmp_path: Path, two_builds: list[Path]) -> None:
    with pytest.raises(FileNotFoundError, match="no extension build"):
        load_build(tmp_path / "missing.so", 0)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(ImportError):
        load_build(junk, 0)
    with pytest.raises(ValueError, match="at least two builds"):
        run_moe_ab(two_builds[:1])
    with pytest.raises(ValueError, match="rounds and calls"):
        run_moe_ab(two_builds, rounds=0)
    with pytest.raises(ValueError, match="tokens"):
        run_moe_ab(two_builds, tokens=0)


def test_cli_names_a_missing_build(tmp_path: Path, capsys) -> None:
    from execstate.cli import main

    assert main(["bench", "builds", "--build", str(tmp_path / "a.so"), "--build", str(tmp_path / "b.so")]) == 2
    assert "no extension build at" in capsys.readouterr().err
