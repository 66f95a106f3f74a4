"""Packaging: ``pip install .`` (no extras) installs everything the product imports.

Two checks:

- static, in this environment: every third-party module that a module of ``execstate/``
  imports at module level belongs to a distribution listed in ``[project].dependencies``;
  a module imported only inside a function is either a dependency too or one of the
  declared optional peers (``OPTIONAL_IMPORTS``), which the code imports lazily with a
  clear message.
- for real, in a fresh virtual environment (``python -m venv``): ``pip install
  torch==2.13.0`` (the pinned CPU build, first, as the Makefile does) and then ``pip install``
  of a clean copy of this repository, non-editable and without extras, through pip's
  configured index and cache. From that environment: import every module of the installed
  package, run every CLI command's ``--help`` (the command tree is read from
  ``execstate.cli.build_parser``, so new commands are covered without editing this file),
  and start ``execstate proxy`` against two unreachable instances: ``/health`` answers 503
  naming both, and the proxy stops on SIGTERM.

The venv costs about 35 s on an idle 2-core machine (torch is a local wheel, the C extension
is compiled once; measured 2.5 minutes with setup and removal while other jobs kept the load at
8), so it stays in the default (CI) set, marked ``packaging`` so that ``-m "not slow and not
packaging"`` skips it while iterating. The venv is removed afterwards (1.4 GB).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execstate.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "execstate"
# Optional peers, imported only inside functions, each with a clear message when missing: none in the
# runtime (the benchmarks' peers, vLLM, llama.cpp and lm-eval, are the bench distribution's, benchmarks/).
OPTIONAL_IMPORTS: dict[str, str] = {}
# Subpackages that belong to an extra: their modules may import that extra's distributions at module
# level; without the extra, importing the subpackage raises ImportError naming the extra.
EXTRA_PACKAGES = {"execstate.fleet.ray_app": "fleet",
                  # the Triton kernels; the engine imports them only where they run (kernels/family.py says where)
                  "execstate.kernels.gpu": "gpu"}
# An extra's distributions may also be imported lazily (inside a function) elsewhere, by a command
# that needs the extra (bench cluster deploys the fleet: it imports the subpackage first, which
# raises the ImportError naming the extra).
LAZY_EXTRA_IMPORTS = {"ray": "fleet", "triton": "gpu"}
# What never travels into the clean copy that gets installed.
_NOT_COPIED = (".git", ".venv", "build", "dist", "*.egg-info", "*.so", "__pycache__", ".pytest_cache",
               ".ruff_cache", ".hypothesis", ".cache")
INSTALL_TIMEOUT_S = 900  # generous: a loaded 2-core machine; typical is ~35 s


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def declared_dependencies(extra: str | None = None) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {_normalise(re.match(r"[A-Za-z0-9_.\-]+", d).group(0)) for d in deps}


def extra_of(path: Path) -> str | None:
    """The extra whose subpackage holds ``path`` (relative to the repository), None for the base."""
    dotted = ".".join(path.with_suffix("").parts)
    return next((e for pkg, e in EXTRA_PACKAGES.items() if dotted == pkg or dotted.startswith(pkg + ".")), None)


@dataclass(frozen=True)
class Import:
    module: str  # top-level name
    path: Path
    lazy: bool  # inside a function body


def third_party_imports() -> list[Import]:
    """Absolute imports of every module under execstate/ that are neither stdlib nor execstate."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        lazy_nodes = {
            id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "execstate":
                    found.append(Import(top, path.relative_to(REPO), id(node) in lazy_nodes))
    return found


def _of_an_extra(imp: Import, dists: set[str], declared: set[str]) -> bool:
    """Imported by the extra's subpackage, or lazily from an extra's distribution elsewhere."""
    extra = extra_of(imp.path)
    if extra is not None and dists & (declared | declared_dependencies(extra)):
        return True
    lazy_extra = LAZY_EXTRA_IMPORTS.get(imp.module)
    return imp.lazy and lazy_extra is not None and bool(dists & declared_dependencies(lazy_extra))


def test_every_import_is_a_declared_dependency_or_a_lazy_optional_peer() -> None:
    declared = declared_dependencies()
    owners = importlib.metadata.packages_distributions()
    imports = third_party_imports()
    assert {i.module for i in imports} >= {"torch", "fastapi", "httpx"}  # the walk sees real imports
    problems = []
    for imp in imports:
        if imp.module in OPTIONAL_IMPORTS:
            if not imp.lazy:
                problems.append(f"{imp.path}: optional {imp.module} imported at module level")
            continue
        dists = {_normalise(d) for d in owners.get(imp.module, [])}
        if not dists:
            problems.append(f"{imp.path}: {imp.module} is not installed here and not a dependency")
        elif _of_an_extra(imp, dists, declared):
            continue
        elif not dists & declared:
            problems.append(f"{imp.path}: {imp.module} (from {sorted(dists)}) is not in [project].dependencies")
    assert problems == []


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of the argparse tree: (), ('models',), ('models', 'list'), ..."""
    paths = [prefix]
    for action in parser._actions:  # argparse keeps sub-commands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += command_paths(sub, (*prefix, name))
    return paths


def test_command_tree_is_read_from_the_parser() -> None:
    paths = command_paths(build_parser())
    assert len(paths) == len(set(paths))
    for expected in [(), ("serve",), ("proxy",), ("demo",), ("models", "prepare"), ("bench", "pd")]:
        assert expected in paths


# -- the fresh venv ---------------------------------------------------------------------


@dataclass(frozen=True)
class Venv:
    root: Path
    work: Path  # a directory outside the repository, the cwd of every command

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def execstate(self) -> Path:
        return self.root / "bin" / "execstate"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list[str | Path], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def venv() -> Iterator[Venv]:
    with tempfile.TemporaryDirectory(prefix="execstate-pkg-") as tmp:
        tmp_path = Path(tmp)
        src, work, root = tmp_path / "src", tmp_path / "work", tmp_path / "venv"
        shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*_NOT_COPIED))
        work.mkdir()
        _run([sys.executable, "-m", "venv", root], work)
        pip = [root / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
        _run([*pip, "torch==2.13.0"], work, INSTALL_TIMEOUT_S)
        _run([*pip, src], work, INSTALL_TIMEOUT_S)
        yield Venv(root, work)


@pytest.mark.packaging
def test_installed_without_extras_imports_every_module(venv: Venv) -> None:
    script = """
import importlib, importlib.metadata, importlib.resources, importlib.util, json, pkgutil, shutil, execstate
extras = EXTRAS
names = sorted(
    m.name for m in pkgutil.walk_packages(execstate.__path__, "execstate.", onerror=lambda name: None)
    if m.name != "execstate.__main__"
)
refused = {}
for name in names:
    if any(name == p or name.startswith(p + ".") for p in extras):
        continue
    importlib.import_module(name)
for pkg in extras:
    try:
        importlib.import_module(pkg)
    except ImportError as e:
        refused[pkg] = str(e)
print(json.dumps({
    "file": execstate.__file__, "modules": names, "refused": refused,
    "dev_extras": [m for m in ("pytest", "hypothesis", "openai", "ruff") if importlib.util.find_spec(m)],
    "kernels_built": importlib.util.find_spec("execstate.kernels._cpu") is not None,
    "world_weights": sorted(
        p.name for p in importlib.import_module("execstate.model.world_default").SHIPPED_DIR.iterdir()
    ),
    "maze_weights": sorted(
        p.name for p in importlib.import_module("execstate.model.world_default").MAZE_SHIPPED_DIR.iterdir()
    ),
    "world_tools": importlib.util.find_spec("tools") is not None,
    "bench": importlib.util.find_spec("execstate_bench") is not None,
    "not_runtime_files": sorted(str(f) for f in importlib.metadata.files("execstate")
                                if str(f).startswith(("execstate/bench/", "execstate_bench/", "benchmarks/", "tools/",
                                                      "tests/"))),
    "world_page": sorted(p.name for p in importlib.resources.files("execstate.serve").joinpath("static").iterdir()),
}))
"""
    script = script.replace("EXTRAS", repr(sorted(EXTRA_PACKAGES)))
    report = json.loads(_run([venv.python, "-c", script], venv.work, 300).stdout.splitlines()[-1])
    # an extra's subpackage, without the extra: a clear ImportError naming it
    assert {pkg: f"execstate[{extra}]" in report["refused"].get(pkg, "") for pkg, extra in EXTRA_PACKAGES.items()} \
        == dict.fromkeys(EXTRA_PACKAGES, True)
    assert Path(report["file"]).is_relative_to(venv.root)  # the installed copy, not the repository
    assert report["dev_extras"] == []
    assert {"model.safetensors", "config.json", "train.json"} <= set(report["world_weights"])  # package data
    assert {"model.safetensors", "config.json", "train.json"} <= set(report["maze_weights"])
    assert report["world_tools"] is False  # no top-level tools package: the world tools are execstate_bench's
    assert report["bench"] is False  # the benchmarks are a distribution of their own (benchmarks/)
    assert report["not_runtime_files"] == []  # the wheel holds the runtime only
    assert {"world.html", "world.js"} <= set(report["world_page"])  # the /world page (package data)
    expected = {
        "execstate." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and p.parent.name != "csrc"
    }
    outside_extras = {m for m in expected if not any(m.startswith(p + ".") for p in EXTRA_PACKAGES)}
    assert outside_extras - {"execstate.__main__"} <= set(report["modules"])
    if shutil.which("cc"):  # optional extension: built whenever there is a compiler
        assert report["kernels_built"]


# Commands whose subcommands come from the repository (tools/, benchmarks/), not from the wheel.
REPOSITORY_COMMANDS = {"world", "bench"}

_INSTALLED_PATHS = """
import argparse, json
from execstate.cli import build_parser
def paths(parser, prefix=()):
    out = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += paths(sub, (*prefix, name))
    return out
print(json.dumps(paths(build_parser())))
"""


@pytest.mark.packaging
def test_every_cli_command_help(venv: Venv) -> None:
    """Every command the installed CLI has prints its help; the installed tree is the repository's
    but for the subcommands the repository's tools add."""
    installed = [tuple(p) for p in json.loads(_run([venv.python, "-c", _INSTALLED_PATHS], venv.work, 60).stdout)]
    repo = command_paths(build_parser())
    assert set(installed) <= set(repo)
    assert {p[0] for p in set(repo) - set(installed)} <= REPOSITORY_COMMANDS
    assert {("serve",), ("proxy",), ("demo",), ("models", "prepare")} <= set(installed)
    paths = installed
    for path in paths:
        out = _run([venv.execstate, *path, "--help"], venv.work, 60).stdout
        assert out.startswith("usage: " + " ".join(["execstate", *path])), (path, out[:200])


@pytest.mark.packaging
def test_bench_and_world_without_the_benchmarks_say_how_to_get_them(venv: Venv) -> None:
    """The wheel holds neither the benchmarks nor the world tools: ``execstate bench ...`` and
    ``execstate world ...`` are one line naming ``make setup``, status 2."""
    for argv in (["bench"], ["bench", "throughput", "--model", "standard"], ["bench", "pd", "--help"],
                 ["world", "train", "--out", "run"]):
        proc = subprocess.run([str(venv.execstate), *argv], cwd=venv.work, env=_env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"execstate {argv[0]}: "), (argv, proc.stderr)
        assert "make setup" in lines[0] and "benchmarks/" in lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.packaging
def test_proxy_starts_and_reports_unreachable_instances(venv: Venv) -> None:
    port = _free_port()
    prefill, decode = "http://127.0.0.1:1", "http://127.0.0.1:2"
    log = venv.work / "proxy.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(venv.execstate), "proxy", "--prefill", prefill, "--decode", decode, "--port", str(port)],
            cwd=venv.work, env=_env(), stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"proxy exited {proc.returncode}: {log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30)
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read().decode()
                break
            except OSError:  # not listening yet
                assert time.monotonic() < deadline, f"proxy did not start: {log.read_text()[-3000:]}"
                time.sleep(0.2)
                continue
            pytest.fail("/health answered 200 with both instances unreachable")
        assert status == 503
        assert prefill in body and decode in body, body
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            pytest.fail("the proxy did not stop on SIGTERM")
    # uvicorn shuts down gracefully, then re-raises the signal it caught: -SIGTERM (0 on older uvicorn).
    assert rc in (0, -signal.SIGTERM), log.read_text()[-3000:]
