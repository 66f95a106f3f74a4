"""Commands added by other distributions (``execstate/commands.py``): ``execstate bench`` comes from
the benchmarks' distribution through the entry-point group ``execstate.commands``; without it, the
command is one line saying how to get it and status 2; a registered command that fails to load
says so the same way and leaves every other command working."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import pytest

import execstate.commands as commands
from execstate.cli import build_parser, main


def _subcommands() -> dict:
    parser = build_parser()
    return next(a.choices for a in parser._actions if a.choices and "serve" in a.choices)


def test_the_benchmarks_register_bench_through_the_entry_point() -> None:
    (ep,) = [e for e in entry_points(group=commands.GROUP) if e.name == "bench"]
    assert ep.value == "execstate_bench.cli:add_bench_parser" and ep.dist is not None
    assert ep.dist.name == "execstate-bench"
    bench = _subcommands()["bench"]
    benches = next(a.choices for a in bench._actions if a.choices)
    assert {"throughput", "pd", "sessions", "world", "duplex", "kernels", "cluster", "soak"} <= set(benches)


@pytest.mark.parametrize("argv", [["bench"], ["bench", "throughput", "--model", "standard"], ["bench", "pd", "-h"]])
def test_bench_without_the_benchmarks_is_one_line_and_status_2(
        argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(commands, "entry_points", lambda group: [])
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"execstate bench: {commands.EXPECTED['bench'][1]}"]
    assert "make setup" in err and "benchmarks/" in err and "Traceback" not in err


def test_a_plugin_that_fails_to_load_is_named_and_the_rest_works(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    broken = EntryPoint(name="bench", value="execstate_no_such_module:add", group=commands.GROUP)
    monkeypatch.setattr(commands, "entry_points", lambda group: [broken])
    assert main(["bench", "throughput"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("execstate bench: its distribution is installed but fails to load "
                           "(execstate_no_such_module:add: ModuleNotFoundError")
    assert main(["models", "list"]) == 0  # the other commands are untouched


def test_a_plugin_cannot_take_a_built_in_name(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rogue = EntryPoint(name="serve", value="execstate_bench.cli:add_bench_parser", group=commands.GROUP)
    real = [e for e in entry_points(group=commands.GROUP) if e.name == "bench"]
    monkeypatch.setattr(commands, "entry_points", lambda group: [rogue, *real])
    choices = _subcommands()
    assert "bench" in choices and choices["serve"].prog.endswith("serve")
    assert "--max-sessions" in choices["serve"].format_help()  # still the runtime's serve
    assert "the command 'serve' of execstate_bench.cli:add_bench_parser is ignored" in capsys.readouterr().err


def test_world_comes_from_the_benchmarks_and_its_trainer_through_an_entry_point() -> None:
    from execstate.model.world.tools_import import world_tool

    assert "world" in _subcommands()
    assert world_tool("train").__name__ == "execstate_bench.world_tools.train"


def test_without_the_world_tools_world_and_prepare_world_are_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    import execstate.model.world.tools_import as tools_import

    monkeypatch.setattr(commands, "entry_points", lambda group: [])
    monkeypatch.setattr(tools_import, "entry_points", lambda group, name: [])
    assert main(["world", "train", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"execstate world: {commands.EXPECTED['world'][1]}"]
    with pytest.raises(tools_import.WorldToolsMissing, match="make setup"):
        tools_import.world_tool("train")
    monkeypatch.setenv("EXECSTATE_CACHE", str(tmp_path / "cache"))
    assert main(["models", "prepare", "world", "--force"]) == 2  # the build needs the trainer
    (line,) = capsys.readouterr().err.splitlines()[-1:]
    assert line.startswith("execstate models: the world-model tools (train) come with") and "make setup" in line
