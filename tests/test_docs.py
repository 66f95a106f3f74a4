"""The repository documents itself: the README's relative links resolve inside the
repository, every ``docs/contracts.md N`` reference in code, tests and docs names a section that
exists, and nothing cites a document or a tracker a clone does not have."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = REPO / "docs" / "contracts.md"
# the design document and the tracker outside the repository (split: this file is scanned too)
OUTSIDE = re.compile("DESIGN" + r"(\.md| \d)|[Ii]ssues? #?\d+|ARCHITECTURE\.md \d")
REF = re.compile(r"contracts\.md((?:[ ,]+(?:and )?\d+)+)")


def sections() -> set[int]:
    return {int(m) for m in re.findall(r"^## (\d+)\. ", CONTRACTS.read_text(), flags=re.M)}


def test_contracts_keep_their_numbering() -> None:
    assert sections() == set(range(2, 12))


def test_readme_links_stay_inside_the_repository() -> None:
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert "docs/ARCHITECTURE.md" in local
    for t in local:
        path = (REPO / t).resolve()
        assert path.is_relative_to(REPO), f"README links outside the repository: {t}"
        assert path.exists(), f"README links to a missing file: {t}"
    assert "shared/DESIGN" not in readme


def test_every_section_reference_exists() -> None:
    known = sections()
    files = [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("execstate/**/*.py"), *REPO.glob("tests/**/*.py"),
             *REPO.glob("tools/**/*.py")]
    refs = 0
    for f in files:
        text = f.read_text()
        bad = OUTSIDE.search(text)
        assert bad is None, f"{f.relative_to(REPO)} cites {bad.group(0)!r}: not in the repository"
        for m in REF.finditer(text):
            for n in re.findall(r"\d+", m.group(1)):
                refs += 1
                assert int(n) in known, f"{f.relative_to(REPO)}: contracts.md {n} does not exist"
    assert refs >= 20


def _two_commands() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]


def test_readme_says_how_to_get_the_command_and_make_demo_ends_saying_it() -> None:
    """The venv is not on PATH after ``make``: the README's two commands and ``make demo``'s last lines say
    how to get ``execstate``."""
    import subprocess

    assert ". .venv/bin/activate" in _two_commands()
    dry = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    tail = dry[dry.index("-m execstate demo"):]  # what runs after the tour
    assert ". .venv/bin/activate" in tail and "execstate serve" in tail


def test_readme_names_what_make_test_needs_beyond_pypi() -> None:
    """Each Debian package ``.ci/run`` installs is named in the README's two commands, with the install line."""
    ci = (REPO / ".ci" / "run").read_text()
    packages = re.findall(r'command -v (\S+) >/dev/null 2>&1 \|\| MISSING="\$MISSING \1"', ci)
    assert packages == ["chromium", "redis-server"]
    section = _two_commands()
    assert "only Python 3.11 and PyPI" not in section
    for name in packages:
        assert f"`{name}`" in section, name
    assert f"apt-get install {' '.join(packages)}" in section and "`CI=1`" in section
