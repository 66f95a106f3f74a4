"""KV cache events (state/kv_events/recorder.py, state/kv_events/publisher.py): a plain ZeroMQ client
subscribes, rebuilds the engine's pool index from the batches (live, plus the replay socket for
what it missed) and finds exactly the keys the block pool holds; keys carry the weights version."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
import zmq
from kv_events_client import replay_all

from execstate import LLM
from execstate.engine.sampling_params import SamplingParams
from execstate.identity.keys import block_key
from execstate.model.loader import load_hf_state_dict
from execstate.state.kv_events.config import KVEventsConfig
from execstate.state.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
EVENTS = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0", include_token_ids=True,
                        replay_endpoint="tcp://127.0.0.1:0")


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, n).tolist()


def pool_keys(llm: LLM) -> set[bytes]:
    pool = llm.engine.block_pool
    return {bytes(k) for k in (pool.key_of(b) for b in range(pool.num_blocks)) if k is not None}


class Index:
    """What a router keeps: keys per medium, rebuilt from the batches in sequence order."""

    def __init__(self) -> None:
        self.keys: dict[str, set[bytes]] = {}
        self.versions: dict[bytes, str | None] = {}
        self.next_seq = 0
        self.stored: list[BlockStored] = []

    def apply(self, seq: int, payload: bytes) -> None:
        assert seq == self.next_seq, f"batch {seq} out of order (expected {self.next_seq})"
        self.next_seq += 1
        for ev in decode_batch(payload).events:
            if isinstance(ev, AllBlocksCleared):
                self.keys.clear()
            elif isinstance(ev, BlockStored):
                self.stored.append(ev)
                self.keys.setdefault(ev.medium, set()).update(ev.block_hashes)
                self.versions.update(dict.fromkeys(ev.block_hashes, ev.weights_version))
            elif isinstance(ev, BlockRemoved):
                self.keys.setdefault(ev.medium, set()).difference_update(ev.block_hashes)



@pytest.fixture()
def small_llm(moe_dir):
    llm = LLM(str(moe_dir), enable_return_routed_experts=True, block_size=4, max_model_len=64, num_kv_blocks=24,
              kv_events=EVENTS)
    yield llm
    llm.engine.kv_events.close()


def test_subscriber_rebuilds_the_pool_index_exactly(small_llm):
    llm = small_llm
    events = llm.engine.kv_events
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events.endpoint)
    time.sleep(0.2)  # the PUB socket drops what it sends before the subscription arrives
    shared = prompt(0, 24)
    # 24 blocks of 4 tokens: these prompts evict each other, so BlockRemoved events are needed
    for i in range(6):
        llm.generate({"prompt_token_ids": shared + prompt(10 + i, 20)}, GREEDY, use_tqdm=False)
    events.flush()
    index = Index()
    received: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if sub.poll(100):
            _, seq, payload = sub.recv_multipart()
            received.append((int.from_bytes(seq, "big", signed=True), payload))
        elif received and received[-1][0] == events.publisher.next_seq - 1:
            break
    sub.close(0)
    assert received, "no live batch"
    first = received[0][0]
    for seq, payload in replay_all(events.replay_endpoint, 0) if first > 0 else []:  # the gap before subscribing
        if seq < first:
            index.apply(seq, payload)
    for seq, payload in received:
        index.apply(seq, payload)
    truth = pool_keys(llm)
    assert len(truth) >= 10
    assert index.keys["pool"] == truth
    assert any(isinstance(e, BlockRemoved) for s, p in received for e in decode_batch(p).events), "no eviction seen"
    # every stored chain is a real chain: key i = H(key i-1, tokens of block i), from its parent
    for ev in index.stored:
        parent = ev.parent_block_hash
        for j, key in enumerate(ev.block_hashes):
            assert block_key(parent, ev.token_ids[j * 4:(j + 1) * 4]) == key
            parent = key
        assert ev.weights_version == llm.engine.provenance.weights_version


def test_replay_from_zero_rebuilds_the_same_index_and_marks_the_end(small_llm):
    llm = small_llm
    for i in range(4):
        llm.generate({"prompt_token_ids": prompt(20 + i, 30)}, GREEDY, use_tqdm=False)
    llm.engine.kv_events.flush()
    assert llm.engine.kv_events.publisher.wait_sent()
    batches = replay_all(llm.engine.kv_events.replay_endpoint, 0)
    assert [s for s, _ in batches] == list(range(len(batches)))
    assert isinstance(decode_batch(batches[0][1]).events[0], AllBlocksCleared)
    index = Index()
    for seq, payload in batches:
        index.apply(seq, payload)
    assert index.keys["pool"] == pool_keys(llm)
    later = replay_all(llm.engine.kv_events.replay_endpoint, 2)
    assert [s for s, _ in later] == list(range(2, len(batches)))


def test_events_carry_the_weights_version(small_llm, moe_dir_other_weights):
    llm = small_llm
    ids = prompt(1, 20)
    llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)
    old = llm.engine.provenance.weights_version
    llm.engine.update_weights(load_hf_state_dict(moe_dir_other_weights), weights_version="v2")
    llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)
    llm.engine.kv_events.flush()
    assert llm.engine.kv_events.publisher.wait_sent()
    index = Index()
    for seq, payload in replay_all(llm.engine.kv_events.replay_endpoint, 0):
        index.apply(seq, payload)
    versions = [ev.weights_version for ev in index.stored]
    assert versions[0] == old and versions[-1] == "user:v2" and old != "user:v2"
    # the same tokens under the new version: other keys, stored again
    first_old = [ev for ev in index.stored if ev.weights_version == old][0].block_hashes[0]
    first_new = [ev for ev in index.stored if ev.weights_version == "user:v2"][0].block_hashes[0]
    assert first_old != first_new


def test_off_by_default_and_config_errors(moe_dir):
    llm = LLM(str(moe_dir), block_size=4, max_model_len=32, num_kv_blocks=8)
    assert llm.engine.kv_events is None
    with pytest.raises(ValueError, match="unknown field"):
        KVEventsConfig.from_json('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}')
    with pytest.raises(ValueError, match="publisher"):
        KVEventsConfig(publisher="kafka")
    cfg = KVEventsConfig.from_json('{"enable_kv_cache_events": true, "endpoint": "tcp://*:5599", "buffer_steps": 5}')
    assert cfg.publishes and cfg.buffer_steps == 5 and cfg.replay_endpoint is None
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").publishes
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x93not a batch")
