"""The migration part of ``execstate bench sessions``: calls the migration measurement when this
build has one, reports that it is not available otherwise.

Session migration provides ``benchmarks/execstate_bench/session_migration.py`` with::

    measure_migration(model_dir: str | Path, context_len: int, repeats: int, ...) -> dict[str, Any]

which moves a live session holding ``context_len`` tokens between two engines in one process and
returns a JSON-able dict; the table reads ``migrate_s`` and ``first_step_s`` (medians over
``repeats``), ``recompute_s``, ``state_recovery_overhead``, ``tokens_equal`` and
``failure_recovery`` (``{fault mode: {"error", "detect_s", "recovery_s", ...}}``); every key is
kept in the report as it is. The part calls it once per context length of the checkpoint part,
positionally ``(model_dir, context_len, repeats)``.

NIXL (under the migration) logs INFO lines through a handler on stdout, where the bench prints
its report (``--json``); that handler is pointed at stderr once the module is imported.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from execstate_bench.machine import loadavg_1m

log = logging.getLogger(__name__)

MODULE = "execstate_bench.session_migration"
NOT_AVAILABLE = "not available in this build"


def migration_part(model_dir: Path, context_lens: Sequence[int], repeats: int) -> dict[str, Any]:
    """``{"available": bool, "reason": str | None, "results": [...]}``; a measurement that raises
    is reported (``error``) rather than ending the bench."""
    try:
        measure = importlib.import_module(MODULE).measure_migration
    except (ImportError, AttributeError) as exc:
        return {"available": False, "reason": f"{NOT_AVAILABLE} ({type(exc).__name__}: {exc})", "results": []}
    _nixl_logs_to_stderr()
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


def _nixl_logs_to_stderr() -> None:
    for h in logging.getLogger("nixl").handlers:
        if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.__stdout__):
            h.setStream(sys.stderr)
