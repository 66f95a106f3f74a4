#!/usr/bin/env python3
"""One step of ``make setup``, with progress: a line when it starts, a line every ``--every`` seconds
while it runs, a line with its time when it ends.

    python3 scripts/setup_step.py --log .venv/setup.log "2/5 execstate and its dependencies" -- \\
        .venv/bin/python -m pip install -e '.[dev]'

The command's own output (pip's, without ``-q``: a line per package) goes to the ``--log`` file
(appended), not to the terminal: a cold install collects about 200 packages, too many lines for a
log that should show the steps. The progress lines count what pip did so far, read from that file
(packages collected, downloaded, being installed). When the command fails, the last lines of its
output are printed and its exit status is returned. Python's standard library only: it runs
before the venv has anything in it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

TAIL_LINES = 40


def progress(log_text: str) -> str:
    """What pip has done so far, from its output (empty when it says nothing countable)."""
    lines = log_text.splitlines()
    collected = sum(line.startswith(("Collecting ", "Processing ")) for line in lines)  # index / local wheel
    downloaded = sum(line.lstrip().startswith("Downloading ") for line in lines)
    parts = []
    if collected:
        parts.append(f"{collected} packages collected")
    if downloaded:
        parts.append(f"{downloaded} downloaded")
    installing = [line for line in lines if line.startswith("Installing collected packages:")]
    if installing:
        parts.append(f"installing {len(installing[-1].split(':', 1)[1].split(','))}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one set-up step with progress lines (module docstring).")
    ap.add_argument("--log", type=Path, required=True, help="file the command's output is appended to")
    ap.add_argument("--every", type=float, default=20.0, help="seconds between progress lines (default: 20)")
    ap.add_argument("step", help="what the step does, as printed, e.g. '2/5 execstate and its dependencies'")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command after --")
    args.log.parent.mkdir(parents=True, exist_ok=True)
    start = args.log.stat().st_size if args.log.exists() else 0
    print(f"setup [{args.step}] ...", flush=True)
    t0 = time.monotonic()
    with open(args.log, "ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while True:
            try:
                status = proc.wait(timeout=args.every)
                break
            except subprocess.TimeoutExpired:
                done = progress(_since(args.log, start))
                print(f"  ... {time.monotonic() - t0:.0f} s" + (f": {done}" if done else ""), flush=True)
    took = time.monotonic() - t0
    done = progress(_since(args.log, start))
    if status != 0:
        tail = _since(args.log, start).splitlines()[-TAIL_LINES:]
        print("\n".join(tail), file=sys.stderr)
        print(f"setup [{args.step}] failed (exit status {status}) after {took:.0f} s; its whole output is in "
              f"{args.log}", file=sys.stderr, flush=True)
        return status
    print(f"  done in {took:.0f} s" + (f" ({done})" if done else ""), flush=True)
    return 0


def _since(log: Path, offset: int) -> str:
    """The log's text written after ``offset`` (this step's part)."""
    with open(log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


if __name__ == "__main__":
    sys.exit(main())
