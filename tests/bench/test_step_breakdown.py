"""``execstate bench throughput --breakdown --quantization gguf`` serves the same GGUF build as the
throughput bench (``step_breakdown.gguf_build``): smollm2-moe's Q4_1 build, not the fp32 directory
(which holds no .gguf file), and a directory given as the model as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

import execstate.model.registry as registry
from execstate_bench import step_breakdown


def test_bench_models_map_to_their_gguf_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    asked: list[str] = []
    monkeypatch.setattr(registry, "resolve_model", lambda name: asked.append(name) or tmp_path / name)
    assert step_breakdown.gguf_build("smollm2-moe") == tmp_path / "smollm2-moe-q4_1"
    assert step_breakdown.gguf_build("smollm2-135m") == tmp_path / "smollm2-135m"
    assert asked == ["smollm2-moe-q4_1", "smollm2-135m"]
    assert step_breakdown.gguf_build(str(tmp_path)) == tmp_path
