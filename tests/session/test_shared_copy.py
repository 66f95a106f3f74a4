"""Copies of live sessions in the shared tier (session/lm/shared_copy.py): engine A copies a live
session (it stays OPEN, keeps its blocks), steps once more, and is "lost"; engine B wakes the
copy from a reference made by a holder of the shared secret (as the fleet's ingress does) and its
next steps equal a session that never moved and ran the same steps up to the copy: the step after
the copy is the loss. The copy is claimed once (a second wake is refused), rebuilt only when the
session changed or its copy was claimed (a hibernation's wake), and deleted when the session ends.
"""

from __future__ import annotations

import pytest
from hibernation_helpers import SAMPLED, close, make, prompt, same_step

from execstate.identity.secret_ring import SecretRing
from execstate.session.lm.hibernation_import import make_reference, wake_from_reference
from execstate.session.lm.shared_copy import SharedCopies
from execstate.session.runtime.migration import MigrationError
from execstate.state.tiers.manifest_store import manifest_key

SECRET = "shared-copy-test-secret-0123456789"


@pytest.fixture()
def pair(moe_dir, redis_server):
    a = make(moe_dir, offload_redis_url=redis_server.url, offload_secret=SECRET)
    b = make(moe_dir, offload_redis_url=redis_server.url, offload_secret=SECRET)
    yield a, b
    close(a)
    close(b)


def _sweep(copies: SharedCopies, llm) -> tuple[int, list[str]]:
    sweep = copies.due(llm.sessions)
    copies.publish(sweep, llm.engine.offload.manifests)
    return len(sweep.put), sweep.delete


def test_copy_resumes_on_another_engine_from_the_copied_step(pair, moe_dir):
    a, b = pair
    oracle = make(moe_dir, num_kv_blocks=64)
    try:
        s = a.open_session(sampling_params=SAMPLED, session_id="moving")
        t = oracle.open_session(sampling_params=SAMPLED, session_id="twin")
        inputs = [prompt(1, 100), prompt(2, 21), prompt(3, 9), prompt(4, 5)]
        for ids in inputs[:2]:
            same_step(s.step(ids), t.step(ids))
        copies = SharedCopies()
        assert _sweep(copies, a) == (1, [])
        assert copies.last == {"moving": 2}
        assert s.info().status == "open" and s.info().num_kv_tokens > 0  # a copy does not put it to sleep
        assert _sweep(copies, a) == (0, [])  # unchanged: not copied again
        s.step(inputs[2])  # after the copy: lost with engine A

        tenant = a.sessions.manager.resident()[0].owner.tenant
        key = manifest_key(a.sessions.port.engine_id, tenant, "moving")
        ref = make_reference(SecretRing(SECRET.encode()), key, "moving", tenant, b.sessions.port.engine_id)
        rt = wake_from_reference(b.sessions, ref)
        assert rt.step_index == 2  # the copy's step: step 3 is the documented loss
        resumed = b.session("moving")
        for ids in inputs[2:]:
            same_step(resumed.step(ids), t.step(ids))

        again = make_reference(SecretRing(SECRET.encode()), key, "moving", tenant, a.sessions.port.engine_id)
        with pytest.raises(MigrationError) as e:
            wake_from_reference(a.sessions, again)  # claimed by B: nobody else wakes it
        assert e.value.code in ("not_found", "conflict")
    finally:
        close(oracle)


def test_copy_follows_changes_hibernation_and_close(pair):
    a, _ = pair
    copies = SharedCopies()
    s = a.open_session(sampling_params=SAMPLED, session_id="s")
    s.step(prompt(5, 40))
    assert _sweep(copies, a) == (1, [])
    tenant = a.sessions.manager.resident()[0].owner.tenant
    key = manifest_key(a.sessions.port.engine_id, tenant, "s")
    store = a.engine.offload.manifests
    assert store.exists([key]) == [True]
    s.step(prompt(6, 3))
    assert _sweep(copies, a) == (1, [])  # changed: copied again
    assert copies.last == {"s": 2}

    s.hibernate()  # its manifest is its copy now
    assert _sweep(copies, a) == (0, [])
    s.wake()  # the wake claims the manifest: no copy in the shared tier until the next sweep
    assert store.exists([key]) == [False]
    assert _sweep(copies, a) == (1, [])
    assert store.exists([key]) == [True]

    s.step(prompt(7, 2))
    assert _sweep(copies, a) == (1, [])
    s.hibernate()
    s.wake()  # slept and woke between two sweeps: the unchanged state's copy is found gone ...
    assert _sweep(copies, a) == (0, [])
    assert store.exists([key]) == [False]
    assert _sweep(copies, a) == (1, [])  # ... and rebuilt at the next one
    assert store.exists([key]) == [True]
    assert _sweep(copies, a) == (0, [])

    s.close()
    put, deleted = _sweep(copies, a)
    assert (put, deleted) == (0, [key])
    assert store.exists([key]) == [False]  # a closed session is never resumed
