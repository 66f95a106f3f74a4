"""The migration part of ``execstate bench sessions``: calls the migration measurement when this
build has one, reports that it is not available otherwise.

Session migration (issue 8) provides ``execstate/bench/session_migration.py`` with::

    measure_migration(model_dir: Path, context_len: int, repeats: int) -> dict[str, Any]

which moves a live session holding ``context_len`` tokens between two engines in one process and
returns medians over ``repeats``, at least ``migration_ms`` (start -> the target serves the
session, verified) and ``failure_recovery_ms`` (an injected failure during migration -> the
session serving again at the source), and ``tokens_identical`` (the migrated session's next steps
equal those in place). Any other keys are kept in the report as they are. The part calls it once
per context length of the checkpoint part.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from execstate.bench.machine import loadavg_1m

log = logging.getLogger(__name__)

MODULE = "execstate.bench.session_migration"
NOT_AVAILABLE = "not available in this build"


def migration_part(model_dir: Path, context_lens: Sequence[int], repeats: int) -> dict[str, Any]:
    """``{"available": bool, "reason": str | None, "results": [...]}``; a measurement that raises
    is reported (``error``) rather than ending the bench."""
    try:
        measure = importlib.import_module(MODULE).measure_migration
    except (ImportError, AttributeError) as exc:
        return {"available": False, "reason": f"{NOT_AVAILABLE} ({type(exc).__name__}: {exc})", "results": []}
    results: list[dict[str, Any]] = []
    for n in context_lens:
        load = loadavg_1m()
        try:
            out = dict(measure(model_dir, n, repeats))
        except Exception as exc:  # noqa: BLE001 - reported, the other parts stand
            log.exception("measure_migration(%s, %d, %d) failed", model_dir, n, repeats)
            out = {"context_tokens": n, "error": f"{type(exc).__name__}: {exc}"}
        out.setdefault("context_tokens", n)
        out["loadavg_1m_before"] = load
        results.append(out)
    return {"available": True, "reason": None, "results": results}
