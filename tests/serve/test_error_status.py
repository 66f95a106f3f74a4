"""The one code -> HTTP status table (serve/errors.py) against every code the package raises.

The package is scanned (its syntax trees, no import): every class deriving from ``CodedError``, at
any depth, and every call of one of them with a literal code; the codes made from a value
(a hand-over's state, a transfer's ``ErrorCode``, a session status's refusal) are enumerated from
their sources. Each must have a status in ``STATUS``. The tables the one table replaced are kept
here as literals: the statuses clients saw before must not change.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import execstate
from execstate.agent.errors import AgentError
from execstate.agent.ledger import LedgerError
from execstate.errors import CodedError
from execstate.serve.errors import STATUS, http_error, relayed_status, status_of
from execstate.session.runtime.events import SessionEventError
from execstate.session.runtime.lifecycle import _REFUSAL
from execstate.session.runtime.migration import MigrationError
from execstate.transfer.errors import ErrorCode
from execstate.transfer.handover import HandoverError, HandoverState

PACKAGE = Path(execstate.__file__).parent

# The tables before there was one: serve/sessions/errors.py STATUS (default 502),
# serve/sessions/handover.py HANDOVER_STATUS (for HandoverError), serve/sessions/migration.py
# _LOCAL (the migrate endpoint, default 502).
OLD_SESSION_STATUS = {
    "invalid": 400, "unauthorized": 403, "target_not_allowed": 403, "wrong_target": 403, "not_found": 404,
    "busy": 409, "conflict": 409, "failed": 409, "session_in_use": 409, "replay": 409, "aborted": 409,
    "stale_state": 409, "incompatible": 409, "stale": 409, "closed": 410, "evicted": 410, "expired": 410,
    "capacity": 429, "quota": 429, "checkpoint_limit": 429, "backpressure": 429, "unsupported": 400,
    "timeout": 504, "internal": 500, "desync": 409, "hibernated": 409, "unavailable": 503,
}
OLD_HANDOVER_STATUS = {"replay": 409, "expired": 410, "capacity": 429, "aborted": 409, "committed": 409,
                       "unknown": 404, "invalid": 400, "importing": 409, "pending": 409}
OLD_MIGRATE_STATUS = {"timeout": 504, "unsupported": 400, "unreachable": 502, "commit_failed": 502}


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py")) if "bench" not in p.parts]


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _coded_classes(trees: list[tuple[Path, ast.Module]]) -> set[str]:
    classes = {"CodedError"}
    bases = {n.name: {_name(b) for b in n.bases} for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    while True:
        more = {name for name, bs in bases.items() if bs & classes} - classes
        if not more:
            return classes
        classes |= more


def raised_codes() -> dict[str, set[str]]:
    """Every literal code passed to a ``CodedError`` class of the package -> where."""
    trees = _trees()
    classes = _coded_classes(trees)
    found: dict[str, set[str]] = {}
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) in classes and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.setdefault(arg.value, set()).add(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_scan_finds_the_error_classes_and_their_codes() -> None:
    classes = _coded_classes(_trees())
    assert {"AgentError", "LedgerError", "HandoverError", "SessionEventError", "MigrationError"} <= classes
    codes = raised_codes()
    # a sample from each class, so a scan that finds nothing cannot pass
    assert {"closed", "duplicate", "replay", "backpressure", "route_mismatch", "budget"} <= set(codes)
    assert len(codes) > 30


def test_every_raised_code_has_a_status() -> None:
    missing = {code: sorted(where) for code, where in raised_codes().items() if code not in STATUS}
    assert not missing, f"codes raised without an HTTP status in serve/errors.py STATUS: {missing}"


def test_codes_made_from_values_have_a_status() -> None:
    made = {s.value for s in HandoverState} | {c.value for c in ErrorCode} | set(_REFUSAL.values())
    assert not made - set(STATUS)


def test_statuses_are_http_errors() -> None:
    assert all(400 <= s <= 599 for s in STATUS.values())


def test_old_tables_are_unchanged() -> None:
    for code, status in OLD_SESSION_STATUS.items():
        assert status_of(code) == status, code
    for code, status in OLD_HANDOVER_STATUS.items():
        assert status_of(code) == status, code
    for code, status in OLD_MIGRATE_STATUS.items():
        assert relayed_status(code) == status, code
    # codes the old session table did not list were 502, and still are (a transfer's, a peer's own)
    for code in ("route_mismatch", "refused", "checksum_mismatch", "unknown_transfer", "bulk", "lost"):
        assert status_of(code) == 502, code
    assert status_of("a_code_of_another_server") == 502
    # the migrate endpoint: whatever the other server refused with is a bad gateway
    for code in ("replay", "wrong_target", "capacity", "not_found", "invalid", "busy"):
        assert relayed_status(code) == 502, code


@pytest.mark.parametrize("cls", [AgentError, LedgerError, HandoverError, SessionEventError, MigrationError])
def test_domain_errors_are_coded_errors(cls: type[CodedError]) -> None:
    err = cls("busy", "session 's' is stepping")
    assert isinstance(err, CodedError)
    assert (err.code, err.message, str(err)) == ("busy", "session 's' is stepping", "busy: session 's' is stepping")
    http = http_error(err)
    assert (http.status, http.code, http.message) == (409, "busy", "session 's' is stepping")
    assert http.body()["error"] == {"message": "session 's' is stepping", "type": "invalid_request_error",
                                    "param": None, "code": "busy"}


def test_a_stream_that_fails_with_a_bug_is_logged_with_its_traceback(caplog) -> None:
    """In-band errors: the request's own (400) are not logged; a bug (500) is, traceback and all,
    since the client only sees its repr."""
    from execstate.serve.context import as_openai_error

    def fail(exc: Exception) -> Exception:
        try:
            raise exc
        except Exception as e:  # noqa: BLE001 - caught to carry a traceback
            return e

    with caplog.at_level("ERROR", logger="execstate.serve.context"):
        assert as_openai_error(fail(ValueError("bad n"))).status == 400
        assert not caplog.records
        err = as_openai_error(fail(KeyError(7)))
    assert err.status == 500 and "KeyError(7)" in err.message
    [rec] = caplog.records
    assert rec.exc_info is not None and rec.exc_info[0] is KeyError
