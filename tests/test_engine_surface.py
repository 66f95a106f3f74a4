"""The engine's surface stays narrow: the layers above reach the engine through named, typed
methods (``AsyncEngine``'s, ``engine/engine_facts.py``, an ``EngineOwned``), never through a
function of the engine run on its thread; and every module of ``engine/`` and ``state/`` is either
public (listed here) or forbidden to the layers above (the ``engine-surface`` import-linter
contract in pyproject.toml, which ``make lint`` checks)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "execstate"

# What the layers above may import of engine/ and state/ (pyproject.toml says why each is public).
PUBLIC = {
    "execstate.engine", "execstate.engine.async_engine", "execstate.engine.engine_facts",
    "execstate.engine.engine_owned", "execstate.engine.session_port",
    "execstate.engine.session_step", "execstate.engine.session_engine", "execstate.engine.config",
    "execstate.engine.offload_config",
    "execstate.engine.pd_config", "execstate.engine.outputs", "execstate.engine.sampling_params",
    "execstate.engine.priority", "execstate.engine.tokenizer", "execstate.engine.chat_template",
    "execstate.engine.validation", "execstate.engine.llm", "execstate.engine.grammar",
    "execstate.engine.grammar.spec", "execstate.engine.grammar.compiler", "execstate.engine.grammar.matcher",
    "execstate.engine.route_trace",
    "execstate.state", "execstate.state.quotas", "execstate.state.kv_events", "execstate.state.kv_events.events",
    "execstate.state.kv_events.config", "execstate.state.kv_events.auth", "execstate.state.host_memory",
    "execstate.state.tiers", "execstate.state.tiers.stats", "execstate.state.tiers.store",
    "execstate.state.tiers.memory_store", "execstate.state.tiers.manifest_store",
    "execstate.state.tiers.manifest_keys",
}


def closures_into_the_engine(source: str) -> list[int]:
    """Lines calling ``run_on_engine(...)`` at all, or ``.call(...)`` with a lambda: a function of
    the engine itself handed to its thread."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        lam = any(isinstance(a, ast.Lambda) for a in node.args)
        if node.func.attr == "run_on_engine" or (node.func.attr == "call" and lam):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scanner_finds_a_closure() -> None:
    code = ("async def f(engine):\n    await engine.run_on_engine(lambda e: e.pd)\n"
            "    engine.call(lambda e: e.kv_events)\n")
    assert closures_into_the_engine(code) == [2, 3]
    assert closures_into_the_engine("async def f(engine):\n    await engine.weights_version()\n") == []


def test_no_layer_above_the_engine_hands_it_a_function() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "engine":
            continue
        found += [f"{rel}:{line}" for line in closures_into_the_engine(path.read_text())]
    assert found == [], f"use a named AsyncEngine method or an EngineOwned instead: {found}"


def modules(package: str) -> set[str]:
    root = REPO / package.replace(".", "/")
    out = set()
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out.add(name.removesuffix(".__init__"))
    return out


def test_every_engine_and_state_module_is_public_or_internal() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (surface,) = [c for c in contracts if c["id"] == "engine-surface"]
    internal = set(surface["forbidden_modules"])
    assert not PUBLIC & internal
    every = modules("execstate.engine") | modules("execstate.state")
    assert every - PUBLIC - internal == set(), "new modules: add each to PUBLIC here or to the forbidden_modules"
    assert (PUBLIC | internal) - every == set(), "gone modules: drop them from PUBLIC or the forbidden_modules"
    assert {"execstate.engine.llm_engine", "execstate.engine.scheduler", "execstate.engine.request",
            "execstate.state.block_pool", "execstate.state.block_holds"} <= internal
