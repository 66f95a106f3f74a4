"""PD loads off the engine thread, between two real engines in one process (NIXL + ZeroMQ):
the other requests keep stepping while a load is in flight, an abort keeps the blocks until
the transfer ended, a local hit releases P's export at once, fenced blocks are bounded, and
handoffs must be signed or allow-listed."""

from __future__ import annotations

import threading
import time

import pytest
from test_pd_inprocess import GREEDY, StuckRead, engine, handoff, prompt, run

from execstate.engine.request import RequestStatus
from execstate.engine.sampling_params import SamplingParams


@pytest.fixture()
def pair(moe_dir):
    p, d = engine(moe_dir, "kv_producer", ttl_s=60.0), engine(moe_dir, "kv_consumer")
    yield p, d
    p.pd.close()
    d.pd.close()


def slow_loads(d, monkeypatch, gate: threading.Event) -> None:
    """D's importer waits for ``gate`` before each load (on the transfer thread)."""
    real = d.pd.importer.load

    def load(*args, **kwargs):
        assert threading.current_thread().name == "execstate-kv-load"
        assert gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(d.pd.importer, "load", load)


def test_engine_keeps_stepping_while_a_load_is_in_flight(pair, monkeypatch):
    p, d = pair
    gate = threading.Event()
    slow_loads(d, monkeypatch, gate)
    stream = d.add_request({"prompt_token_ids": prompt(40, 20)},
                           SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    d.step()
    ids = prompt(41, 50)
    _, kv = handoff(p, ids)
    rid = d.add_request({"prompt_token_ids": ids}, GREEDY, kv_transfer_params=kv)
    tokens_during_load = 0
    for _ in range(10):  # the load cannot finish (gate closed): the stream is served every step
        outs = {o.request_id: o for o in d.step()}
        assert stream in outs and rid not in outs
        assert d.requests[rid].status is RequestStatus.WAITING_FOR_REMOTE_KVS
        tokens_during_load += 1
    assert len(d.requests[stream].output_token_ids) == 1 + tokens_during_load
    gate.set()
    done = None
    while done is None:
        done = next((o for o in d.step() if o.request_id == rid and o.finished), None)
    assert done.prompt_token_sources == {"local_cache": 0, "offloaded": 0, "transferred": 48, "computed": 2}
    single = run(engine(p.model_path), ids)
    assert done.outputs[0].token_ids == single.outputs[0].token_ids
    while d.has_unfinished_requests():
        d.step()
    assert d.block_pool.num_used == 0
    d.check_integrity()


def test_idle_step_waits_for_the_load_instead_of_spinning(pair, monkeypatch):
    p, d = pair
    gate = threading.Event()
    slow_loads(d, monkeypatch, gate)
    ids = prompt(42, 40)
    _, kv = handoff(p, ids)
    d.add_request({"prompt_token_ids": ids}, GREEDY, kv_transfer_params=kv)
    d.step()
    t0 = time.monotonic()
    assert d.step() == []  # nothing to run: blocks until the idle timeout (no wake-up)
    assert time.monotonic() - t0 >= 0.04
    threading.Timer(0.1, gate.set).start()
    t0 = time.monotonic()
    while d.scheduler.num_loading:
        d.step()
    assert time.monotonic() - t0 < 10


def test_abort_while_loading_frees_blocks_only_after_the_transfer(pair, monkeypatch):
    p, d = pair
    gate = threading.Event()
    slow_loads(d, monkeypatch, gate)
    ids = prompt(43, 40)
    _, kv = handoff(p, ids)
    rid = d.add_request({"prompt_token_ids": ids}, GREEDY, kv_transfer_params=kv)
    d.step()
    held = d.block_pool.num_used
    assert held == 3
    out = d.abort_request(rid)
    assert out.finished and out.outputs[0].finish_reason == "abort"
    for _ in range(3):
        d.step()
        assert d.block_pool.num_used == held  # the read may still land in them
    gate.set()
    deadline = time.monotonic() + 10
    while d.has_unfinished_requests() and time.monotonic() < deadline:
        d.step()
    assert d.block_pool.num_used == 0 and not d.has_unfinished_requests()
    d.check_integrity()


def test_local_hit_releases_the_export_without_the_ttl(pair):
    p, d = pair
    ids = prompt(44, 40)
    run(d, ids)  # D computed this prompt itself: its cache holds both full blocks
    _, kv = handoff(p, ids)
    assert p.pd.num_pinned_exports == 1
    out = run(d, ids, kv=kv)
    assert out.prompt_token_sources == {"local_cache": 32, "offloaded": 0, "transferred": 0, "computed": 8}
    assert d.pd.stats.loads == 0 and d.pd.stats.released_without_load == 1
    deadline = time.monotonic() + 10  # the Release travels on the transfer thread; the TTL is 60 s
    while p.pd.num_pinned_exports and time.monotonic() < deadline:
        time.sleep(0.01)
        p.poll()
    assert p.pd.num_pinned_exports == 0 and p.pd.exporter.stats.released == 1
    assert p.pd.exporter.stats.expired == 0


def test_fenced_blocks_are_bounded(moe_dir, monkeypatch):
    p = engine(moe_dir, "kv_producer")
    d = engine(moe_dir, "kv_consumer", max_fenced_blocks=2)
    try:
        bulk, stuck = d.pd.bulk, StuckRead()
        real_load = d.pd.importer.load

        def stuck_once(*args, **kwargs):
            res = real_load(*args, **kwargs)
            if not bulk._stuck and stuck.state == "PROC":
                bulk._stuck[1] = stuck
            return res

        monkeypatch.setattr(d.pd.importer, "load", stuck_once)
        monkeypatch.setattr(bulk, "_xfer_state", lambda h: h.state)
        ids = prompt(45, 40)
        first = run(d, ids, kv=handoff(p, ids)[1])
        assert "could not be cancelled" in first.error and len(d.pd.fenced_blocks) == 2
        ids2 = prompt(46, 40)
        _, kv2 = handoff(p, ids2)
        refused = run(d, ids2, kv=kv2)
        assert refused.outputs[0].finish_reason == "abort" and "max_fenced_blocks=2" in refused.error
        assert d.block_pool.num_used == 2  # only the fence
        stuck.state = "ERR"  # the read failed for good: reclaim
        deadline = time.monotonic() + 10
        while d.pd.fenced_blocks and time.monotonic() < deadline:
            time.sleep(0.02)
            d.poll()
        assert d.block_pool.num_used == 0
        ids3 = prompt(47, 40)
        ok = run(d, ids3, kv=handoff(p, ids3)[1])
        assert ok.error is None and ok.prompt_token_sources["transferred"] == 32
        deadline = time.monotonic() + 10  # the refused handoff's export was released, not left to the TTL
        while p.pd.num_pinned_exports and time.monotonic() < deadline:
            time.sleep(0.01)
            p.poll()
        assert p.pd.num_pinned_exports == 0
        d.check_integrity()
    finally:
        p.pd.close()
        d.pd.close()


def test_unsigned_or_tampered_handoff_is_refused_before_admission(moe_dir):
    p = engine(moe_dir, "kv_producer", secret=None)  # no secret: unsigned handoffs
    d = engine(moe_dir, "kv_consumer")
    d_listed = engine(moe_dir, "kv_consumer", secret=None, allowed_prefill={"prefill-x": p.pd.server.addr})
    try:
        ids = prompt(48, 40)
        _, kv = handoff(p, ids)
        assert "signature" not in kv
        with pytest.raises(ValueError, match="not signed"):
            d.add_request({"prompt_token_ids": ids}, GREEDY, kv_transfer_params=kv)
        assert d.requests == {} and not d.has_unfinished_requests()
        # allow-listed by engine id: D dials the address from its own list, not the JSON's
        listed = dict(kv, remote_engine_id="prefill-x", remote_addr="tcp://127.0.0.1:1")
        out = run(d_listed, ids, kv=listed)
        assert out.error is None and out.prompt_token_sources["transferred"] == 32
        plain = engine(moe_dir)
        with pytest.raises(ValueError, match="no kv_consumer connector"):
            plain.add_request({"prompt_token_ids": ids}, GREEDY, kv_transfer_params=kv)
    finally:
        for e in (p, d, d_listed):
            e.pd.close()


def test_handoff_is_signed_by_p(pair):
    p, d = pair
    _, kv = handoff(p, prompt(49, 40))
    assert d.pd.accept_handoff(kv).transfer_id == kv["transfer_id"]
    assert kv["expires_at"] > time.time() + 50 and len(kv["signature"]) == 64
    bad = dict(kv, epoch=kv["epoch"] + 1)
    with pytest.raises(ValueError, match="signature"):
        d.add_request({"prompt_token_ids": prompt(49, 40)}, GREEDY, kv_transfer_params=bad)
