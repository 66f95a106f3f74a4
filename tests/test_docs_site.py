"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing anchor, or a page
under ``docs/`` that the navigation leaves out fails the build (``validation`` in ``mkdocs.yml``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_mkdocs_strict_build(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for page in ("index.html", "getting-started/index.html", "ARCHITECTURE/index.html", "cli/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_docs_page_is_in_the_navigation() -> None:
    import yaml

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for v in node.values() for p in pages(v)]
        return []

    listed = pages(nav)
    on_disk = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert sorted(listed) == on_disk
