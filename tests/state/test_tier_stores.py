"""The ``UnitStore`` contract (state/tiers/store.py) for every backend: the disk tier and the shared
tier on a real ``redis-server`` (started per test on a free loopback port).

Content-addressed and idempotent (first writer wins, also with concurrent writers), bounded (the
oldest units go; LRU vs FIFO), and never failing the caller: a store that is down, full or slow
answers "not stored" / "absent" within its timeout and comes back after its backoff.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time

import pytest

from execstate.identity.keys import BlockKey
from execstate.state.tiers.disk_store import DiskStore
from execstate.state.tiers.redis_store import RedisStore
from execstate.state.tiers.store import UnitIndex


def key(i: int) -> BlockKey:
    return BlockKey(hashlib.sha256(f"unit-{i}".encode()).digest())


def blob(i: int, n: int = 1000) -> list[bytes]:
    body = bytes((i * 7 + j) % 256 for j in range(n))
    return [b"head", body]


@pytest.fixture(params=["disk", "redis"])
def make_store(request, tmp_path):
    """``make(capacity, policy)`` -> a fresh store of the parametrised backend."""
    made = []
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")

        def make(capacity=1 << 20, policy="lru", **kw):
            s = RedisStore(server.url, capacity, policy, timeout_s=kw.pop("timeout_s", 1.0), **kw)
            made.append(s)
            return s
    else:
        def make(capacity=1 << 20, policy="lru", **kw):
            kw.pop("timeout_s", None)
            s = DiskStore(tmp_path / "units", capacity, policy, **kw)
            made.append(s)
            return s
    yield make
    for s in made:
        s.close()


def test_round_trip_and_idempotent_put(make_store):
    s = make_store()
    assert s.put(key(1), blob(1)) is True
    assert s.contains(key(1)) and not s.contains(key(2))
    assert bytes(s.get(key(1))) == b"".join(blob(1))
    assert s.put(key(1), blob(2)) is False  # first writer wins
    assert bytes(s.get(key(1))) == b"".join(blob(1))
    assert s.get(key(2)) is None
    snap = s.stats.snapshot()
    assert (snap.units, snap.bytes, snap.write_backs) == (1, 1004, 1)


def test_concurrent_writers_of_one_key_leave_one_whole_unit(make_store):
    stores = [make_store() for _ in range(4)]  # four writers (on disk: four indexes of one directory)
    barrier = threading.Barrier(8)
    wrote = []

    def write(n):
        barrier.wait()
        wrote.append(stores[n % 4].put(key(9), blob(n, 50_000)))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = bytes(stores[0].get(key(9)))
    assert got in {b"".join(blob(n, 50_000)) for n in range(8)}
    for s in stores[1:]:
        assert bytes(s.get(key(9))) == got  # every reader sees that same unit


def test_a_full_store_drops_its_oldest_units(make_store):
    s = make_store(capacity=3 * 1004)
    for i in range(3):
        assert s.put(key(i), blob(i))
    s.get(key(0))  # LRU: unit 0 is now the most recent
    assert s.put(key(3), blob(3))
    assert [s.contains(key(i)) for i in range(4)] == [True, False, True, True]
    assert s.get(key(1)) is None
    assert s.stats.snapshot().dropped == {"full": 1}
    assert s.put(key(5), [b"x" * 5000]) is False  # larger than the whole tier
    assert s.stats.snapshot().dropped == {"full": 2}


def test_fifo_ignores_reads(make_store):
    s = make_store(capacity=3 * 1004, policy="fifo")
    for i in range(3):
        s.put(key(i), blob(i))
    s.get(key(0))
    s.put(key(3), blob(3))
    assert [s.contains(key(i)) for i in range(4)] == [False, True, True, True]


def test_discard(make_store):
    s = make_store()
    s.put(key(1), blob(1))
    s.discard(key(1))
    s.discard(key(2))  # absent: ignored
    assert not s.contains(key(1)) and s.get(key(1)) is None
    assert s.stats.snapshot().units == 0


def test_disk_units_survive_a_restart_and_leftovers_go(tmp_path):
    d = tmp_path / "units"
    s = DiskStore(d, 1 << 20)
    for i in range(3):
        s.put(key(i), blob(i))
    stray = s.path_of(key(7)).with_name("x.unit.tmp-1-2-3")
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"partial")
    again = DiskStore(d, 2 * 1004)  # smaller: the oldest found is dropped
    assert [again.contains(key(i)) for i in range(3)] == [False, True, True]
    assert bytes(again.get(key(2))) == b"".join(blob(2))
    assert not stray.exists()
    assert not s.path_of(key(0)).exists()


def test_disk_write_failure_degrades_and_recovers(tmp_path, caplog):
    d = tmp_path / "units"
    s = DiskStore(d, 1 << 20, backoff_s=0.2)
    s.put(key(1), blob(1))
    sub = s.path_of(key(2)).parent
    if sub.exists():
        os.rmdir(sub)
    sub.write_bytes(b"not a directory")  # every write under it fails
    with caplog.at_level(logging.WARNING, logger="execstate.offload"):
        assert s.put(key(2), blob(2)) is False
        assert s.put(key(3), blob(3)) is False  # unavailable: refused at once
    assert "offload tier disk is unavailable" in caplog.text
    snap = s.stats.snapshot()
    assert not snap.available and snap.errors == 1 and snap.dropped.get("error") == 1
    assert not s.contains(key(1))  # nothing is offered while the tier is down
    sub.unlink()
    time.sleep(0.25)
    assert s.put(key(2), blob(2)) is True and s.contains(key(1))
    assert s.stats.snapshot().available


def test_redis_stopped_mid_run_degrades_within_the_timeout(redis_server, caplog):
    s = RedisStore(redis_server.url, 1 << 20, timeout_s=0.3, backoff_s=0.5)
    assert s.put(key(1), blob(1))
    redis_server.kill()
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="execstate.offload"):
        assert s.get(key(1)) is None
        assert s.put(key(2), blob(2)) is False
    assert time.monotonic() - t0 < 2.0
    assert "offload tier redis is unavailable" in caplog.text
    assert not s.contains(key(1)) and not s.stats.snapshot().available
    redis_server.start()  # back, empty: the unit is gone, the index learns it on the next read
    time.sleep(0.55)
    assert s.put(key(3), blob(3)) is True
    assert s.get(key(1)) is None and not s.contains(key(1))
    assert bytes(s.get(key(3))) == b"".join(blob(3))
    s.close()


def test_redis_slow_server_times_out(redis_server):
    s = RedisStore(redis_server.url, 1 << 20, timeout_s=0.2, backoff_s=60)
    s.put(key(1), blob(1))
    admin = redis_server.client()
    admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")  # the server answers nobody for 1.5 s
    t0 = time.monotonic()
    assert s.get(key(1)) is None
    assert time.monotonic() - t0 < 1.0
    assert not s.contains(key(1)) and s.stats.snapshot().errors == 1
    s.close()


def test_redis_out_of_memory_drops_our_oldest_and_never_blocks(redis_factory):
    server = redis_factory("--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
    s = RedisStore(server.url, 1 << 30)  # our own bound is far away: the server refuses first
    stored = sum(s.put(key(i), blob(i, 100_000)) for i in range(40))
    snap = s.stats.snapshot()
    assert stored == 40  # each refusal dropped our oldest units and the retry went through
    assert snap.dropped.get("full", 0) > 0 and snap.units < 40
    assert bytes(s.get(key(39))) == b"".join(blob(39, 100_000))
    s.close()


def test_two_engines_share_one_redis(redis_server):
    a = RedisStore(redis_server.url, 1 << 20)
    b = RedisStore(redis_server.url, 1 << 20)
    assert a.put(key(1), blob(1))
    assert not b.contains(key(1))  # the index is local (docs/offload.md: what is left)
    assert bytes(b.get(key(1))) == b"".join(blob(1)) and b.contains(key(1))
    assert b.put(key(1), blob(2)) is False
    a.close()
    b.close()


def test_index_bounds():
    idx = UnitIndex(10, "lru")
    assert idx.add(key(1), 4) == [] and idx.add(key(2), 4) == []
    assert idx.add(key(3), 4) == [key(1)]
    assert idx.nbytes == 8 and len(idx) == 2
    with pytest.raises(ValueError, match="exceeds"):
        idx.add(key(4), 11)
    with pytest.raises(ValueError, match="policy"):
        UnitIndex(10, "random")
