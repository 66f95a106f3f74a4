"""``docs/cli.md`` is the command line's own ``--help`` text, for every command and subcommand.

The page is generated from the parser (``execstate.cli.build_parser``), never written by hand, so
it cannot drift: this test regenerates it and compares. After changing a flag, regenerate it with
``python tests/test_cli_reference.py``. ``execstate bench`` comes from the benchmarks' distribution
(``benchmarks/``, an entry point): the page documents it as installed, so the generator needs it
(``make setup`` installs it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "cli.md"
WIDTH = "100"  # argparse wraps to $COLUMNS

HEADER = """# Command line reference

Every command of `execstate`, with its options and their defaults, as `--help` prints them. This
page is generated from the parser (`python tests/test_cli_reference.py`) and checked by the test
suite, so it is always the installed version's.
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for its subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(name: str, parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(name, parser)]
    for sub, p in _subparsers(parser).items():
        out += _walk(f"{name} {sub}", p)
    return out


def render() -> str:
    import importlib.util

    from execstate.cli import build_parser

    if importlib.util.find_spec("execstate_bench") is None:
        raise RuntimeError("docs/cli.md documents `execstate bench`: install the benchmarks first (make setup, or "
                           "pip install -e benchmarks)")

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [HEADER]
        for name, parser in _walk("execstate", build_parser()):
            parser.prog = name
            parts.append(f"\n## `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def test_cli_page_is_the_parsers_help() -> None:
    want = render()
    assert PAGE.read_text() == want, "docs/cli.md is stale: run `python tests/test_cli_reference.py`"
    assert "## `execstate serve`" in want and "--max-sessions" in want
    assert "## `execstate bench throughput`" in want and "--r3-paired" in want  # the benchmarks' entry point


def test_every_serve_flag_says_what_it_does_and_its_default():
    """Every ``serve`` option has help text naming its default."""
    from execstate.cli import build_parser

    serve = _subparsers(build_parser())["serve"]
    missing = [a.option_strings or [a.dest] for a in serve._actions
               if not isinstance(a, argparse._HelpAction) and "(default" not in (a.help or "")]
    assert missing == []


RST_MARKUP = re.compile(r"``|:[a-z]+:`")  # reST literals and roles (:class:`...`), as docstrings write them


def test_help_is_plain_text_without_docstring_markup() -> None:
    """Every ``--help`` (the page renders each one) reads as plain text on a terminal."""
    found = [(m.group(), line) for line in render().splitlines() for m in RST_MARKUP.finditer(line)
             if not line.startswith("```")]
    assert found == []


@pytest.mark.parametrize(("doc", "want"), [
    ("Command line: ``execstate models|serve ...`` (fast)", "Command line: execstate models|serve ... (fast)"),
    ("equal to ``LLM.score`` and :class:`~execstate.engine.llm.LLM`, :func:`run`", "equal to LLM.score and LLM, run"),
    ("for ``execstate\nbench sessions`` and standalone::\n\n    python -m x", "for execstate\nbench sessions and "
     "standalone:\n\n    python -m x"),
    (":meth:`AsyncEngine.call` keeps `single quotes`", "AsyncEngine.call keeps `single quotes`"),
])
def test_plain_removes_rst_inline_markup(doc: str, want: str) -> None:
    from execstate.help_text import plain

    assert plain(doc) == want
    assert RST_MARKUP.search(plain(doc)) is None


@pytest.mark.parametrize("name", ["harness", "session_migration", "gpu_check", "structured"])
def test_the_python_m_benchmarks_help_is_plain_text(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmarks run as ``python -m`` take their description from their docstring's start."""
    import importlib

    module = importlib.import_module(f"execstate_bench.{name}")
    with pytest.raises(SystemExit):
        module.main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage:")
    assert RST_MARKUP.search(text) is None, text


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(REPO)}")

