"""KV events are private (docs/security.md): a feed names the blocks a replica holds, so it must not
reach whoever can open a TCP connection, nor tell them what tenants asked.

Findings of the identity review, each a test: the feed bound every interface with no
authentication, a subscriber on the machine's non-loopback address received the token ids of a
salted tenant's prompt, and nothing said so at start-up. Now:

- by default the feed binds loopback: a subscriber on a non-loopback address gets nothing;
- a non-loopback endpoint needs the instances' shared secret (CURVE), and is refused without it;
  a plain subscriber gets nothing, one holding the secret gets the batches;
- a subscriber learns block keys, never token ids, unless the operator opts in;
- the blocks of an excluded tenant are never mentioned, stored or removed.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import zmq

from execstate import LLM
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.scope import CacheScope
from execstate.identity.secret_ring import SecretRing
from execstate.state.kv_events.auth import secure_client
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.kv_events.events import BlockRemoved, BlockStored, decode_batch
from execstate.state.kv_events.publisher import ZmqEventPublisher

GREEDY = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
RING = SecretRing(b"kv-events-test-secret-0123456789")


def outside_address() -> str | None:
    """This machine's address on a non-loopback interface (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this picks the outward interface
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def prompt(seed: int, n: int = 24) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def engine(model_dir, **events) -> LLM:
    cfg = KVEventsConfig(enable_kv_cache_events=True, **{"endpoint": "tcp://127.0.0.1:0", **events})
    return LLM(str(model_dir), enable_return_routed_experts=True, block_size=4, max_model_len=64, kv_events=cfg)


def run(llm: LLM, ids: list[int], tenant: str = "local", salt: str | None = None) -> None:
    eng = llm.engine
    eng.add_request({"prompt_token_ids": ids}, GREEDY, scope=CacheScope.build(tenant, salt))
    while eng.has_unfinished_requests():
        eng.step()
    eng.kv_events.flush()
    assert eng.kv_events.publisher.wait_sent()


def receive(sock: zmq.Socket, seconds: float) -> list[bytes]:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sock.poll(50):
            out.append(sock.recv_multipart()[2])
    return out


def subscriber(endpoint: str, ring: SecretRing | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    if ring is not None:
        secure_client(sock, ring)
    sock.connect(endpoint)
    return sock


def events_of(payloads: list[bytes]) -> list:
    return [e for p in payloads for e in decode_batch(p).events]


def test_the_default_endpoint_is_loopback_and_unreachable_from_outside(model_dir):
    assert KVEventsConfig().endpoint == "tcp://127.0.0.1:5557"  # vLLM binds every interface
    addr = outside_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    llm = engine(model_dir)
    port = llm.engine.kv_events.endpoint.rsplit(":", 1)[1]
    sub = subscriber(f"tcp://{addr}:{port}")
    try:
        time.sleep(0.3)
        run(llm, prompt(1), "alpha", "alpha-salt")
        assert receive(sub, 1.0) == []
    finally:
        sub.close(0)
        llm.engine.kv_events.close()


def test_a_non_loopback_feed_needs_the_shared_secret():
    with pytest.raises(ValueError, match="EXECSTATE_KV_SECRET"):
        ZmqEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:0"))
    with pytest.raises(ValueError, match="authentication"):
        ZmqEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0",
                                         replay_endpoint="tcp://0.0.0.0:0"))


def test_on_every_interface_only_a_holder_of_the_secret_reads_the_feed(model_dir, monkeypatch):
    monkeypatch.setenv("EXECSTATE_KV_SECRET", RING.current.decode())
    llm = engine(model_dir, endpoint="tcp://*:0")
    ev = llm.engine.kv_events
    assert ev.publisher.secured
    port = ev.endpoint.rsplit(":", 1)[1]
    where = outside_address() or "127.0.0.1"
    plain, wrong = subscriber(f"tcp://{where}:{port}"), subscriber(f"tcp://{where}:{port}",
                                                                   SecretRing(b"not-the-fleet-secret-0123"))
    holder = subscriber(f"tcp://{where}:{port}", RING)
    try:
        time.sleep(0.5)
        ids = prompt(2)
        run(llm, ids, "alpha", "alpha-salt")
        got = receive(holder, 1.5)
        assert receive(plain, 0.3) == [] and receive(wrong, 0.3) == []
        stored = [e for e in events_of(got) if isinstance(e, BlockStored)]
        keys = llm.engine.kv_manager.identity(CacheScope.build("alpha", "alpha-salt")).chain(ids, 4)
        assert {k for e in stored for k in e.block_hashes} == {bytes(k) for k in keys}
        assert all(e.token_ids == [] for e in stored)  # keys, never tokens, by default
    finally:
        for s in (plain, wrong, holder):
            s.close(0)
        ev.close()


def test_token_ids_only_when_the_operator_opts_in(model_dir):
    llm = engine(model_dir, include_token_ids=True)
    ev = llm.engine.kv_events
    sub = subscriber(ev.endpoint)
    try:
        time.sleep(0.3)
        ids = prompt(3)
        run(llm, ids, "alpha")
        stored = [e for e in events_of(receive(sub, 1.0)) if isinstance(e, BlockStored)]
        assert [t for e in stored for t in e.token_ids] == ids
    finally:
        sub.close(0)
        ev.close()


def test_an_excluded_tenant_is_never_mentioned(model_dir):
    llm = LLM(str(model_dir), enable_return_routed_experts=True, block_size=4, max_model_len=64, num_kv_blocks=20,
              kv_events=KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0",
                                       exclude_tenants=["alpha"]))
    ev = llm.engine.kv_events
    sub = subscriber(ev.endpoint)
    try:
        time.sleep(0.3)
        kv = llm.engine.kv_manager
        alpha_keys, bravo_keys = set(), set()
        for i in range(6):  # 20 blocks: the prompts evict each other, removals included
            a, b = prompt(10 + i), prompt(20 + i)
            run(llm, a, "alpha")
            run(llm, b, "bravo")
            alpha_keys |= {bytes(k) for k in kv.identity(CacheScope.build("alpha")).chain(a, 4)}
            bravo_keys |= {bytes(k) for k in kv.identity(CacheScope.build("bravo")).chain(b, 4)}
        events = events_of(receive(sub, 1.0))
        named = {k for e in events if isinstance(e, BlockStored | BlockRemoved) for k in e.block_hashes}
        assert not named & alpha_keys
        assert named & bravo_keys
        assert any(isinstance(e, BlockRemoved) for e in events)
    finally:
        sub.close(0)
        ev.close()
