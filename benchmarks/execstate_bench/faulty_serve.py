"""``python -m execstate_bench.faulty_serve FAULT_JSON serve MODEL ...``: ``execstate serve`` whose
decode side loads through a fault-injecting importer (``execstate_bench/faults.py``).

For ``execstate bench pd``'s failure checks and the HTTP tests only: fault injection is not
reachable from any server option or ``--kv-transfer-config`` key. ``FAULT_JSON`` is a
``FaultInjection`` dict such as ``{"mode": "corrupt"}``; the rest is the ``execstate serve``
command line, parsed by the CLI's own parser and run by ``run_server`` with the faulty importer
as the connector's ``make_importer`` (nothing is patched).
"""

from __future__ import annotations

import json
import sys

from execstate.cli import build_parser
from execstate.logs import setup_cli_logging
from execstate.serve.server import run_server
from execstate_bench.faults import FaultInjection, importer_factory

USAGE = "usage: python -m execstate_bench.faulty_serve FAULT_JSON serve MODEL [serve options]"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "serve":
        raise SystemExit(USAGE)
    faults = FaultInjection.from_dict(json.loads(argv[0]))
    args = build_parser().parse_args(argv[1:])
    setup_cli_logging()
    return run_server(args, make_importer=importer_factory(faults))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
