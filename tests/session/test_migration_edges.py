"""Session migration: the edges. A migrating session refuses everything but close; sessions
without KV migrate; a desync between the route records sent with the KV and the control state is
detected; a replayed offer cannot complete (another target refuses it as not its own; its own
target as a conflict); an imported session serves nothing until committed; unsigned offers are
refused, allow-list or not; an engine without a connector refuses clearly; and, over random
histories, a migrated session (also migrated back) steps exactly as it would have in place."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from migration_helpers import Engines, assert_holds_nothing, assert_same_steps
from session_helpers import GREEDY, SAMPLED, check_accounting, make_llm, tokens

from execstate.session.lm.migration import migrate_session, wait_import
from execstate.session.lm.migration_source import begin_export, finish_export
from execstate.session.lm.migration_target import begin_import
from execstate.session.lm.migration_wire import MigrationError
from execstate.session.runtime.events import SessionEventError


def export(llm, session_id: str, target, window_s: float = 30.0):
    """``begin_export`` of ``session_id`` for ``target``'s engine, with a fresh nonce."""
    return begin_export(llm.sessions, session_id, window_s, target_engine_id=target.engine.pd.instance_id,
                        nonce=f"{np.random.default_rng().integers(1 << 62):032x}")

A, B, C = tokens(40, 37), tokens(41, 6), tokens(42, 9)


@pytest.fixture()
def engines(moe_dir):
    built = Engines(moe_dir)
    yield built
    built.close()


def test_a_migrating_session_refuses_everything_but_close(engines):
    a = engines()
    s = a.open_session(sampling_params=GREEDY)
    s.step(A)
    b = engines()
    out = export(a, s.session_id, b)
    assert s.status == "migrating" and a.engine.pd.num_pinned_exports == 1
    for call in (lambda: s.step(B), lambda: s.submit_event(5, "input", {"token_ids": B}), s.checkpoint,
                 lambda: s.fork(None), s.reset, lambda: s.migrate(b)):
        with pytest.raises(SessionEventError) as e:
            call()
        assert e.value.code == "busy"
    finish_export(a.sessions, out, ok=False)
    assert s.status == "open" and a.engine.pd.num_pinned_exports == 0
    s.step(B)
    out = export(a, s.session_id, b)
    s.close()  # allowed while migrating; finishing later changes nothing
    finish_export(a.sessions, out, ok=True)
    a.engine.poll()
    assert a.engine.kv_holds.num_holders == 0 and a.engine.block_pool.num_used == 0
    check_accounting(a)


def test_sessions_without_kv_migrate(engines, moe_dir):
    a, b = engines(), engines()
    empty = a.open_session(sampling_params=GREEDY, session_id="empty")
    m = migrate_session(empty, b)
    assert (m.result.num_tokens, m.result.blocks_transferred, m.result.tokens_recomputed) == (0, 0, 0)
    short = a.open_session(sampling_params=GREEDY, session_id="pending-only")
    short.submit_event(3, "input", {"token_ids": C})  # never stepped: only a pending event
    s2 = short.migrate(b)
    ref = make_llm(moe_dir).open_session(sampling_params=GREEDY)
    ref.submit_event(3, "input", {"token_ids": C})
    assert_same_steps([s2.step()], [ref.step()])
    assert_same_steps([m.session.step(A)], [make_llm(moe_dir).open_session(sampling_params=GREEDY).step(A)])
    m.session.close()
    s2.close()
    check_accounting(b)


def test_a_route_desync_between_the_two_channels_is_detected(engines):
    a, b = engines(), engines()
    real = a.engine.pd.exporter.export

    def tampered(tid, epoch, block_ids, keys, routes, num_tokens):
        routes = routes.copy()
        routes[20] = routes[20, :, ::-1]  # valid expert ids, another order: not the rows the session has
        return real(tid, epoch, block_ids, keys, routes, num_tokens)

    a.engine.pd.exporter.export = tampered
    s = a.open_session(sampling_params=GREEDY, session_id="desync")
    s.step(A)
    with pytest.raises(MigrationError) as e:
        migrate_session(s, b)
    assert e.value.code == "route_mismatch"
    assert_holds_nothing(b, "desync")
    assert s.status == "open" and len(s.step(B).token_ids) == 8


def test_a_replayed_offer_cannot_complete(engines):
    a, b, c = engines(), engines(), engines()
    s = a.open_session(sampling_params=GREEDY, session_id="replay")
    s.step(A)
    out = export(a, s.session_id, b)
    handle = begin_import(b.sessions, out.payload)
    result = wait_import(b.sessions, handle, out)
    assert result.blocks_transferred == 2
    moved = b.session("replay")
    with pytest.raises(SessionEventError) as e:  # imported, not served before the commit
        moved.step(B)
    assert e.value.code == "busy" and moved.status == "migrating"
    finish_export(a.sessions, out, ok=True)
    handle.commit()
    assert moved.status == "open"
    with pytest.raises(MigrationError) as e:  # the same offer, again, elsewhere: not that engine's offer
        begin_import(c.sessions, out.payload)
    assert e.value.code == "wrong_target"
    assert_holds_nothing(c, "replay")
    with pytest.raises(MigrationError) as e:  # and where it already lives
        begin_import(b.sessions, out.payload)
    assert e.value.code == "conflict"


def test_an_abandoned_import_is_never_served(engines):
    a, b = engines(), engines()
    s = a.open_session(sampling_params=GREEDY, session_id="abandoned")
    s.step(A)
    out = export(a, s.session_id, b)
    handle = begin_import(b.sessions, out.payload)
    wait_import(b.sessions, handle, out)
    handle.abandon("the source asked to abort")  # the acknowledgement never reached the source
    with pytest.raises(MigrationError) as e:
        handle.commit()
    assert e.value.code == "aborted"
    finish_export(a.sessions, out, ok=False)
    assert s.status == "open" and len(s.step(B).token_ids) == 8
    assert_holds_nothing(b, "abandoned")


def test_unsigned_offers_are_refused_allow_listed_or_not(engines, monkeypatch):
    monkeypatch.delenv("EXECSTATE_KV_SECRET", raising=False)
    a = engines(secret=None)
    listed = engines(secret=None, allowed_prefill={a.engine.pd.instance_id: a.engine.pd.server.addr})
    s = a.open_session(sampling_params=GREEDY)
    s.step(A)
    for target in (listed, engines(secret=None), engines()):
        with pytest.raises(MigrationError) as e:
            migrate_session(s, target)
        assert e.value.code == "unsupported"  # the source has no secret to sign with: nothing is sent
        assert s.status == "open"
    assert len(s.step(B).token_ids) == 8


def test_engines_without_a_connector_refuse(engines, moe_dir):
    plain, b = make_llm(moe_dir), engines()
    s = plain.open_session(sampling_params=GREEDY)
    s.step(A)
    with pytest.raises(MigrationError) as e:
        migrate_session(s, b)
    assert e.value.code == "unsupported" and s.status == "open"
    s2 = engines().open_session(sampling_params=GREEDY)
    s2.step(A)
    with pytest.raises(MigrationError) as e:
        migrate_session(s2, plain)
    assert e.value.code == "unsupported" and s2.status == "open"
    consumer_only = engines(role="kv_consumer")
    s3 = consumer_only.open_session(sampling_params=GREEDY)
    s3.step(A)
    with pytest.raises(MigrationError) as e:
        migrate_session(s3, b)
    assert e.value.code == "unsupported"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_histories_migrate_and_migrate_back(engines, moe_dir, data):
    if not hasattr(engines, "pair"):
        engines.pair = (engines(), engines(), make_llm(moe_dir))
    a, b, ref_llm = engines.pair
    params = data.draw(st.sampled_from([GREEDY, SAMPLED]))
    seed = data.draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
    inputs = [rng.integers(3, 500, n).tolist() for n in lengths]
    before = data.draw(st.integers(1, len(inputs)))
    ref = ref_llm.open_session(sampling_params=params)
    want = [ref.step(x, max_tokens=4) for x in inputs]
    s = a.open_session(sampling_params=params)
    got = [s.step(x, max_tokens=4) for x in inputs[:before]]
    s = s.migrate(b)
    got += [s.step(x, max_tokens=4) for x in inputs[before:]]
    s = s.migrate(a)  # and back: a's cache may hold the prefix now
    assert_same_steps(got, want)
    assert s.token_ids == ref.token_ids and s.routed_experts.tobytes() == ref.routed_experts.tobytes()
    s.close()
    ref.close()
    for llm in (a, b):
        llm.engine.poll()
        assert llm.engine.kv_holds.num_holders == 0 and llm.engine.block_pool.num_used == 0
        check_accounting(llm)


def test_the_same_engine_and_a_stale_state_are_refused(engines, moe_dir_other_weights):
    a, b = engines(), engines()
    s = a.open_session(sampling_params=GREEDY)
    s.step(A)
    with pytest.raises(MigrationError) as e:
        migrate_session(s, a)
    assert e.value.code == "invalid"
    a.update_weights(moe_dir_other_weights)  # the session's KV is now from other weights
    with pytest.raises(MigrationError) as e:
        migrate_session(s, b)
    assert e.value.code == "stale_state" and s.status == "open"
    assert_holds_nothing(b, s.session_id)
    with pytest.raises(MigrationError) as e:
        s.migrate(b, timeout_s=0)
    assert e.value.code == "invalid"  # a window of 0 s
