"""Session state keys (docs/contracts.md 2): golden value, manual byte layout, every field
changes the key, stable across processes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.provenance import Provenance
from execstate.identity.session_keys import DOMAIN_SESSION, session_state_key

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE = ExecutionIdentity(Provenance(model_id="Qwen/Qwen3-30B-A3B", weights_version="sha256:0123abcd",
                                   dtype="bfloat16", numerics="eager+torch-cpu"))
TOKENS = list(range(1000, 1040))  # 2 full blocks of 16 + a tail of 8
CHAIN = BASE.chain(TOKENS, 16)[-1]
TAIL = TOKENS[32:]

# Golden values: they change only if the layout changes. Update deliberately, never to pass a test.
GOLDEN = "b4966832e59c5a5c631d808dda42b98b3fb0878c4a33d1e21eadd24a21fd5c84"
GOLDEN_EMPTY = "6a679e0f9f3e51d51f8517f6c01db1795dd36e6cbc5b5bb4db1b71cc9c630700"


def _u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


def test_golden_values():
    assert session_state_key(CHAIN, TAIL, 3, 2, "branch-a").hex() == GOLDEN
    assert session_state_key(BASE.root, [], 0, 0, "b").hex() == GOLDEN_EMPTY


def test_manual_byte_layout():
    tail = b"".join(t.to_bytes(8, "little", signed=True) for t in TAIL)
    manual = hashlib.sha256(
        _u64(len(DOMAIN_SESSION)) + DOMAIN_SESSION + CHAIN + _u64(len(TAIL)) + tail + _u64(3) + _u64(2)
        + _u64(len(b"branch-a")) + b"branch-a"
    ).hexdigest()
    assert manual == GOLDEN


@pytest.mark.parametrize(
    "changed",
    [
        dict(chain=BASE.with_provenance(BASE.provenance.replace(weights_version="sha256:0123abce"))
             .chain(TOKENS, 16)[-1]),
        dict(chain=BASE.chain(TOKENS[:32], 16)[0]),
        dict(tail=TAIL[:-1]),
        dict(tail=[*TAIL[:-1], 7]),
        dict(step_index=4),
        dict(event_epoch=3),
        dict(branch_id="branch-b"),
    ],
)
def test_every_field_changes_the_key(changed):
    base = dict(chain=CHAIN, tail=TAIL, step_index=3, event_epoch=2, branch_id="branch-a")
    assert session_state_key(**{**base, **changed}).hex() != GOLDEN


def test_fields_do_not_run_into_each_other():
    # step 1 / epoch 0 vs step 0 / epoch 1, and a branch id vs a longer one with the same prefix
    assert session_state_key(CHAIN, [], 1, 0, "x") != session_state_key(CHAIN, [], 0, 1, "x")
    assert session_state_key(CHAIN, [5], 0, 0, "x") != session_state_key(CHAIN, [], 5, 0, "x")


@pytest.mark.parametrize(
    ("kw", "exc"),
    [(dict(chain=b"short"), ValueError), (dict(step_index=-1), ValueError), (dict(event_epoch=True), ValueError),
     (dict(branch_id=""), ValueError), (dict(tail=[1.5]), TypeError)],
)
def test_bad_fields_raise(kw, exc):
    base = dict(chain=CHAIN, tail=TAIL, step_index=3, event_epoch=2, branch_id="branch-a")
    with pytest.raises(exc):
        session_state_key(**{**base, **kw})


def test_same_key_in_another_process_with_another_hash_seed():
    code = (
        "from execstate.identity.execution import ExecutionIdentity;"
        "from execstate.identity.provenance import Provenance;"
        "from execstate.identity.session_keys import session_state_key;"
        "p = ExecutionIdentity(Provenance(model_id='Qwen/Qwen3-30B-A3B', weights_version='sha256:0123abcd',"
        " dtype='bfloat16', numerics='eager+torch-cpu')); t = list(range(1000, 1040));"
        "print(session_state_key(p.chain(t, 16)[-1], t[32:], 3, 2, 'branch-a').hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == GOLDEN
