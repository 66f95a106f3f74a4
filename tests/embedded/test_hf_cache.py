"""``serve <HF repo id>``: a model the local Hugging Face cache holds, resolved offline.

A fake cache in the Hugging Face layout (``HF_HOME`` pointing at a temp dir: ``hub/models--ORG--NAME``
with ``refs/main``, ``snapshots/<commit>/`` of symlinks into ``blobs/``, as ``hf download`` leaves
it) holds a tiny random model with its tokenizer. Oracle: the same model loaded from its snapshot
directory gives the same tokens. Every test runs with the network cut (a socket that connects is a
failure), so nothing can be downloaded, found or not.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))

from serve_helpers import write_tokenizer  # noqa: E402

from execstate import LLM, SamplingParams  # noqa: E402
from execstate.model import registry  # noqa: E402
from execstate.model.errors import UnknownModelError  # noqa: E402
from execstate.model.hf_cache import ModelNotCachedError, cached_snapshot, hub_cache_dir, looks_like_repo_id  # noqa: E402
from execstate.model.random_models import make_random  # noqa: E402

REPO = "acme/tiny-moe"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    d = make_random("qwen3_moe", tmp_path_factory.mktemp("hf_source"), seed=0)
    write_tokenizer(d)
    return d


def put_in_cache(hub: Path, source: Path, repo: str = REPO, commit: str = COMMIT, ref: str | None = "main",
                 files: list[str] | None = None) -> Path:
    """``source``'s files as ``hf download`` caches them; returns the snapshot directory."""
    repo_dir = hub / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(source.iterdir()):
        if files is not None and f.name not in files:
            continue
        blob = repo_dir / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    if ref is not None:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline or not, nothing is downloaded
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


def test_a_cached_repo_id_resolves_to_its_snapshot_and_serves(hf_home, source) -> None:
    snapshot = put_in_cache(hf_home / "hub", source)
    assert cached_snapshot(REPO) == snapshot == registry.resolve_model(REPO)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    by_id = LLM(REPO, seed=0).generate("the quick brown fox", greedy, use_tqdm=False)[0].outputs[0]
    by_dir = LLM(str(source), seed=0).generate("the quick brown fox", greedy, use_tqdm=False)[0].outputs[0]
    assert by_id.token_ids == by_dir.token_ids and by_id.text == by_dir.text


def test_a_revision_is_its_ref_or_commit(hf_home, source) -> None:
    other = "fedcba9876543210fedcba9876543210fedcba98"
    put_in_cache(hf_home / "hub", source)
    (hf_home / "hub" / "models--acme--tiny-moe" / "snapshots" / other).mkdir()
    assert cached_snapshot(REPO, revision=COMMIT).name == COMMIT
    assert cached_snapshot(REPO).name == COMMIT  # refs/main


def test_an_absent_repo_is_one_clear_error(hf_home, capsys, monkeypatch) -> None:
    with pytest.raises(ModelNotCachedError) as err:
        registry.resolve_model("acme/not-cached")
    text = str(err.value)
    assert "'acme/not-cached' is not in the Hugging Face cache at" in text and str(hf_home / "hub") in text
    assert "execstate never downloads" in text and "hf download acme/not-cached" in text
    assert isinstance(err.value, UnknownModelError)
    from execstate.cli import main

    monkeypatch.setattr("execstate.logs.setup_cli_logging", lambda: None)
    assert main(["serve", "acme/not-cached"]) == 2
    out = capsys.readouterr().err
    assert out.count("\n") == 1 and out.startswith("execstate serve: model 'acme/not-cached' is not in the Hugging")


def test_a_partial_snapshot_or_a_missing_ref_is_named(hf_home, source) -> None:
    put_in_cache(hf_home / "hub", source, files=["config.json", "tokenizer.json"])
    with pytest.raises(ModelNotCachedError, match=r"has no \*\.safetensors weights \(a partial download"):
        cached_snapshot(REPO)
    put_in_cache(hf_home / "hub", source, repo="acme/unreferenced", ref=None)
    with pytest.raises(ModelNotCachedError, match=f"holds the snapshot\\(s\\) {COMMIT} but no ref for main"):
        cached_snapshot("acme/unreferenced")


def test_the_cache_directory_follows_hugging_faces_variables(tmp_path, monkeypatch) -> None:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hub_cache_dir() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hub_cache_dir() == tmp_path / "legacy"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_cache_dir() == tmp_path / "hub"


@pytest.mark.parametrize(("name", "is_id"), [("Qwen/Qwen3-30B-A3B", True), ("acme/tiny_moe.v2", True),
                                              ("smollm2-moe", False), ("./models/x", False), ("/abs/path", False),
                                              ("a/b/c", False), ("acme/../etc", False), ("-a/b", False)])
def test_repo_id_shape(name: str, is_id: bool) -> None:
    assert looks_like_repo_id(name) is is_id


def test_a_directory_wins_over_a_repo_id(hf_home, source, tmp_path, monkeypatch) -> None:
    """``org/name`` that is a local directory with config.json is that directory, as before."""
    local = tmp_path / "acme" / "tiny-moe"
    shutil.copytree(source, local)
    monkeypatch.chdir(tmp_path)
    assert registry.resolve_model(REPO) == Path(REPO)
