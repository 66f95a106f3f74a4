"""``python -m execstate.bench.faulty_serve FAULT_JSON serve MODEL ...``: ``execstate serve`` whose
decode side loads through a fault-injecting importer (``transfer/faults.py``).

For ``execstate bench pd``'s failure checks and the HTTP tests only: fault injection is not
reachable from any server option or ``--kv-transfer-config`` key. ``FAULT_JSON`` is a
``FaultInjection`` dict such as ``{"mode": "corrupt"}``; the rest is the ``execstate`` command line.
"""

from __future__ import annotations

import json
import sys

from execstate import cli
from execstate.engine import pd_connector
from execstate.transfer.faults import FaultInjection, importer_factory


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: python -m execstate.bench.faulty_serve FAULT_JSON serve MODEL [serve options]")
    faults = FaultInjection.from_dict(json.loads(argv[0]))
    pd_connector.KVImporter = importer_factory(faults)  # type: ignore[misc]
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
