"""Registry: cache location, atomic builds, markers, dependencies, resolve_model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from execstate import paths
from execstate.model import registry
from execstate.model.registry import MARKER, EmbeddedModel


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("EXECSTATE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "execstate"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "execstate"
    monkeypatch.setenv("EXECSTATE_CACHE", str(tmp_path / "es"))
    assert paths.cache_dir() == tmp_path / "es"
    assert paths.model_dir("m") == tmp_path / "es" / "models" / "m"


class FakeModels:
    """Two cheap fake embedded models (b depends on a) in a temp cache."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.source = tmp_path / "source.bin"
        self.source.write_bytes(b"v1")
        self.builds: list[str] = []
        self.fail = False
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("EXECSTATE_CACHE", str(tmp_path / "cache"))
        self.set_models(recipe=1)

    def build(self, name: str):
        def _build(out_dir: Path, deps: list[Path], **params) -> None:
            self.builds.append(name)
            (out_dir / "config.json").write_text(json.dumps({"name": name, "deps": [str(d) for d in deps]}))
            if self.fail:
                raise RuntimeError("build failed half-way")
            (out_dir / "model.safetensors").write_bytes(b"weights")

        return _build

    def set_models(self, recipe: int) -> None:
        models = {
            "fake-a": EmbeddedModel("fake-a", "A", recipe, self.build("fake-a"), lambda: self.source),
            "fake-b": EmbeddedModel("fake-b", "B", 1, self.build("fake-b"), lambda: self.source,
                                    depends=("fake-a",), params={"seed": 0}),
        }
        self.monkeypatch.setattr(registry, "EMBEDDED_MODELS", models)


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeModels:
    return FakeModels(tmp_path, monkeypatch)


def test_prepare_builds_once_with_marker(fake):
    path = registry.prepare("fake-b")
    assert path == paths.model_dir("fake-b")
    assert fake.builds == ["fake-a", "fake-b"]
    marker = json.loads((path / MARKER).read_text())
    assert marker["name"] == "fake-b" and marker["recipe_version"] == 1
    assert len(marker["source_sha256"]) == 64 and marker["params"] == {"seed": 0}
    assert marker["depends"]["fake-a"] == json.loads((paths.model_dir("fake-a") / MARKER).read_text())["fingerprint"]
    assert registry.prepare("fake-b") == path
    assert fake.builds == ["fake-a", "fake-b"]
    assert [m["prepared"] for m in registry.list_models()] == [True, True]
    assert not list(paths.models_dir().glob(".fake-*.tmp-*"))


def test_directory_without_marker_is_rebuilt(fake):
    path = paths.model_dir("fake-a")
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "junk").write_text("partial copy")
    assert not registry.is_prepared("fake-a")
    registry.prepare("fake-a")
    assert fake.builds == ["fake-a"] and not (path / "junk").exists()
    (path / MARKER).unlink()
    assert registry.list_models()[0]["prepared"] is False
    registry.prepare("fake-a")
    assert fake.builds == ["fake-a", "fake-a"]


def test_changed_source_or_recipe_rebuilds_dependents(fake):
    registry.prepare("fake-b")
    fake.source.write_bytes(b"v2")
    registry._SHA_CACHE.clear()  # same size; mtime may not change within the clock resolution
    assert not registry.is_prepared("fake-a") and not registry.is_prepared("fake-b")
    registry.prepare("fake-b")
    assert fake.builds == ["fake-a", "fake-b"] * 2
    fake.set_models(recipe=2)
    assert not registry.is_prepared("fake-b")  # its dependency's fingerprint changed
    registry.prepare("fake-b")
    assert fake.builds == ["fake-a", "fake-b"] * 3
    registry.prepare("fake-b", force=True)
    assert fake.builds == ["fake-a", "fake-b"] * 3 + ["fake-b"]


def test_failed_build_leaves_previous_build_and_no_temp(fake):
    registry.prepare("fake-a")
    before = (paths.model_dir("fake-a") / MARKER).read_text()
    fake.fail = True
    with pytest.raises(RuntimeError, match="half-way"):
        registry.prepare("fake-a", force=True)
    assert (paths.model_dir("fake-a") / MARKER).read_text() == before
    assert (paths.model_dir("fake-a") / "model.safetensors").exists()
    assert not list(paths.models_dir().glob(".fake-a.tmp-*"))
    fake.fail = False


def test_failed_first_build_leaves_nothing(fake):
    fake.fail = True
    with pytest.raises(RuntimeError):
        registry.prepare("fake-a")
    assert not paths.model_dir("fake-a").exists()
    assert not list(paths.models_dir().glob(".fake-a.tmp-*"))


def test_missing_source_trusts_existing_build_only(fake, monkeypatch):
    registry.prepare("fake-a")

    def missing() -> Path:
        raise FileNotFoundError("package not installed")

    models = dict(registry.EMBEDDED_MODELS)
    models["fake-a"] = EmbeddedModel("fake-a", "A", 1, fake.build("fake-a"), missing)
    monkeypatch.setattr(registry, "EMBEDDED_MODELS", models)
    assert registry.is_prepared("fake-a")
    assert registry.prepare("fake-a") == paths.model_dir("fake-a")
    with pytest.raises(FileNotFoundError):
        registry.prepare("fake-a", force=True)
    assert registry.is_prepared("fake-a")


def test_resolve_model(fake, tmp_path):
    local = tmp_path / "local-model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    assert registry.resolve_model(local) == local
    assert registry.resolve_model(str(local)) == local
    assert registry.resolve_model("fake-b") == paths.model_dir("fake-b")
    assert fake.builds == ["fake-a", "fake-b"]
    with pytest.raises(ValueError, match=r"'nope'.*fake-a, fake-b"):
        registry.resolve_model("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a directory containing config.json"):
        registry.resolve_model(tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown embedded model"):
        registry.prepare("nope")


def test_a_world_model_is_not_a_language_model():
    with pytest.raises(ValueError, match="'world' is a world model, not a language model"):
        registry.resolve_model("world")


def test_real_registry_entries():
    models = registry.EMBEDDED_MODELS
    names = ["smollm2-135m", "smollm2-moe", "smollm2-moe-q8_0", "smollm2-moe-q4_1", "world"]
    assert list(models) == names
    assert models["smollm2-moe"].depends == ("smollm2-135m",)
    assert models["smollm2-moe-q4_1"].depends == models["smollm2-moe-q8_0"].depends == ("smollm2-moe",)
    assert models["smollm2-moe-q4_1"].params == {"fmt": "Q4_1", "embedding": "Q8_0"}
    assert [m.kind for m in models.values()] == ["lm", "lm", "lm", "lm", "world"]
    for m in models.values():
        assert m.description and m.recipe_version >= 1
    listed = registry.list_models()
    assert [m["name"] for m in listed] == names
    assert set(listed[0]) == {"name", "description", "prepared", "state", "path"}


def test_the_shipped_world_model_is_listed_as_shipped(tmp_path, monkeypatch, capsys):
    """On a fresh cache the world model is ready (its weights ship), not "not prepared"."""
    from execstate import cli
    from execstate.model.world_default import SHIPPED_DIR, default_world_model_dir

    monkeypatch.setenv("EXECSTATE_CACHE", str(tmp_path / "empty-cache"))
    world = {m["name"]: m for m in registry.list_models()}["world"]
    assert world["state"] == "shipped" and world["prepared"] is False
    assert Path(world["path"]) == SHIPPED_DIR == default_world_model_dir()  # where it really loads from
    assert registry.shipped_dir("world") == SHIPPED_DIR and registry.shipped_dir("smollm2-moe") is None
    monkeypatch.setattr("execstate.logs.setup_cli_logging", lambda: None)  # no handler on this test's stderr
    assert cli.main(["models", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert re.match(r"world +shipped +realtime world model", rows["world"])
    assert re.match(r"smollm2-moe +not prepared +Qwen3-MoE", rows["smollm2-moe"])
    assert rows["shipped:"].startswith("shipped: its weights come with the package")


def test_shipped_weights_then_a_build(fake, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    models = dict(registry.EMBEDDED_MODELS)
    models["fake-a"] = EmbeddedModel("fake-a", "A", 1, fake.build("fake-a"), lambda: fake.source, shipped=shipped)
    monkeypatch.setattr(registry, "EMBEDDED_MODELS", models)
    assert registry.list_models()[0]["state"] == "not prepared"  # an empty directory ships nothing
    (shipped / "model.safetensors").write_bytes(b"weights")
    assert registry.list_models()[0] | {"description": ""} == {
        "name": "fake-a", "description": "", "prepared": False, "state": "shipped", "path": str(shipped)}
    registry.prepare("fake-a")
    assert registry.list_models()[0]["state"] == "prepared"
    assert registry.list_models()[0]["path"] == str(paths.model_dir("fake-a"))


def test_build_prints_progress_once_and_a_prepared_model_is_silent(fake, monkeypatch, capsys):
    calls = []

    def build(name: str, steps: tuple[str, ...]):
        def _build(out_dir: Path, deps: list[Path], on_step) -> None:
            for s in steps:
                on_step(s)
            calls.append(name)
            (out_dir / "config.json").write_text("{}")

        return _build

    a_steps, b_steps = ("dequantising", "writing"), ("calibrating", "making experts", "writing")
    monkeypatch.setattr(registry, "EMBEDDED_MODELS", {
        "fake-a": EmbeddedModel("fake-a", "A", 1, build("fake-a", a_steps), lambda: fake.source,
                                steps=a_steps, estimate="about 1 s"),
        "fake-b": EmbeddedModel("fake-b", "B", 1, build("fake-b", b_steps), lambda: fake.source,
                                depends=("fake-a",), steps=b_steps),
    })
    registry.prepare("fake-b")
    lines = capsys.readouterr().err.splitlines()
    timed = [line.rsplit(" [", 1) for line in lines]
    assert [t[0] for t in timed] == [
        "building fake-a (first run only; needed by fake-b; about 1 s) ...",
        "building fake-a: step 1/2 dequantising ...",
        "building fake-a: step 2/2 writing ...",
        timed[3][0],
        "building fake-b (first run only) ...",
        "building fake-b: step 1/3 calibrating ...",
        "building fake-b: step 2/3 making experts ...",
        "building fake-b: step 3/3 writing ...",
        timed[8][0],
    ]
    assert all(t[1].endswith(" s]") and float(t[1][:-3]) >= 0 for t in timed if len(t) == 2)
    for line, name in ((lines[3], "fake-a"), (lines[8], "fake-b")):
        head, path = line.split(": ", 1)
        assert head.startswith(f"built {name} in ") and head.endswith(" s") and path == str(paths.model_dir(name))
    assert calls == ["fake-a", "fake-b"]
    registry.prepare("fake-b")
    assert capsys.readouterr().err == "" and calls == ["fake-a", "fake-b"]


def test_real_entries_declare_their_build_steps():
    from execstate.model import gguf_import, upcycle
    from execstate.model.world import recipe as world_recipe

    models = registry.EMBEDDED_MODELS
    assert models["smollm2-135m"].steps == gguf_import.BUILD_STEPS and len(gguf_import.BUILD_STEPS) == 3
    assert models["smollm2-moe"].steps == upcycle.BUILD_STEPS and len(upcycle.BUILD_STEPS) == 4
    assert models["world"].steps == world_recipe.BUILD_STEPS and len(world_recipe.BUILD_STEPS) == 2
    from execstate.model import gguf_quantize

    assert models["smollm2-moe-q4_1"].steps == gguf_quantize.BUILD_STEPS and len(gguf_quantize.BUILD_STEPS) == 3
    assert all(m.estimate for m in models.values())
