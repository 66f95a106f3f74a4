"""Logging for the command line: ``setup_cli_logging()`` (called once by ``execstate.cli.main``).

Library code only creates loggers (``logging.getLogger(__name__)``, all under ``execstate``)
and never configures them. The CLI gives the ``execstate`` logger one stderr handler at
INFO, so ``execstate serve``'s start-up block and the other INFO lines are shown; other
libraries' loggers (httpx, uvicorn, ...) keep their own settings. Records still propagate,
so a root handler configured by an embedding program also sees them.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_cli_logging(level: int = logging.INFO) -> None:
    logger = logging.getLogger("execstate")
    for h in [h for h in logger.handlers if getattr(h, "execstate_cli", False)]:
        if getattr(h, "stream", None) is sys.stderr:
            return  # already set up (main() called twice in one process)
        logger.removeHandler(h)  # bound to a stderr that has since been replaced (and maybe closed)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, datefmt="%H:%M:%S"))
    handler.execstate_cli = True  # type: ignore[attr-defined]  # marks our handler (found again above)
    logger.addHandler(handler)
    logger.setLevel(level)
