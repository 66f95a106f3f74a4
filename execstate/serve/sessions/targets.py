"""Where a session may be migrated to: the ``--migration-targets`` allow-list (docs/security.md).

Each entry is a target's base URL (``http(s)://host:port``) or an engine id with it
(``ENGINE_ID=http(s)://host:port``); the flag repeats, and an entry may list several,
comma-separated. ``POST /v1/sessions/{id}/migrate``'s ``target`` must name an entry: by its URL
or by its engine id. Anything else is refused (``target_not_allowed``) before the session is
touched or anything is sent, so no client can make the server send a session, or anything else,
to an address the operator did not list. Without entries, migration is off.

An entry without an engine id is asked for it (a signed ``identify`` call, ``handover_wire.py``)
before each migration: the offer is bound to that engine, which refuses an offer for any other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from execstate.session.runtime.migration import MigrationError

_ENGINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$")


@dataclass(frozen=True)
class Target:
    base: str  # scheme://host:port
    engine_id: str | None  # None: asked with identify


def base_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``; ``ValueError`` for anything else (a path, a query, ...)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise ValueError(f"a migration target is 'http(s)://host:port', got {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ValueError(f"a migration target has a bad port: {url!r}") from None
    return f"{parts.scheme}://{parts.netloc}"


class MigrationTargets:
    """The allow-list (module docstring); immutable."""

    def __init__(self, targets: list[Target] | None = None) -> None:
        self.targets = list(targets or [])

    @classmethod
    def parse(cls, entries: list[str] | None) -> MigrationTargets:
        """From ``--migration-targets`` values; ``ValueError`` naming a bad entry."""
        targets: list[Target] = []
        for value in entries or []:
            for entry in (e.strip() for e in value.split(",")):
                if not entry:
                    continue
                engine_id, sep, url = entry.partition("=")
                if not sep:
                    engine_id, url = "", entry
                if sep and not _ENGINE_ID.match(engine_id):
                    raise ValueError(f"--migration-targets {entry!r}: bad engine id {engine_id!r}")
                targets.append(Target(base_url(url), engine_id or None))
        return cls(targets)

    def __bool__(self) -> bool:
        return bool(self.targets)

    def describe(self) -> tuple[str, ...]:
        """Each target as ``--migration-targets`` would name it (``ENGINE_ID=URL`` or ``URL``)."""
        return tuple(f"{x.engine_id}={x.base}" if x.engine_id else x.base for x in self.targets)

    def resolve(self, target: str) -> Target:
        """The listed target ``target`` names (its URL or its engine id); ``target_not_allowed`` else."""
        try:
            base = base_url(target)
        except ValueError:
            base = None
        for t in self.targets:
            if t.base == base or (t.engine_id is not None and t.engine_id == target):
                return t
        listed = "none: migration is off (--migration-targets)" if not self.targets else \
            ", ".join(t.engine_id or t.base for t in self.targets)
        raise MigrationError("target_not_allowed", f"{target[:200]!r} is not in this server's migration targets "
                             f"(listed: {listed})")
