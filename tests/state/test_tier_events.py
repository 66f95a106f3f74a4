"""The tiers' unit events (state/tiers/unit_events.py): whatever a tier does (writes, drops for
room, discards, reads of another writer's units, adoption, a restart's scan), the events it
reported, applied in order, give exactly the keys it would answer a lookup for, each stored
event naming its unit's record."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from execstate.identity.checksum import checksum
from execstate.identity.keys import BlockKey, block_key
from execstate.state.tiers.disk_store import DiskStore
from execstate.state.tiers.host_cache import HostCache
from execstate.state.tiers.store import UnitIndex
from execstate.state.tiers.unit import FORMAT_VERSION, UnitLayout, UnitRecord, pack_unit

LAYOUT = UnitLayout(num_layers=1, block_size=2, num_kv_heads=1, head_dim=2, dtype="float32")
ROOT = BlockKey(b"\x01" * 32)


class Recorder:
    """A subscriber of one process's tiers: applies the calls in order, per medium."""

    def __init__(self) -> None:
        self.keys: dict[str, set[BlockKey]] = {}
        self.records: dict[tuple[str, BlockKey], UnitRecord | None] = {}
        self.calls = 0

    def unit_stored(self, medium: str, key: BlockKey, record: UnitRecord | None) -> None:
        assert key not in self.keys.setdefault(medium, set()), "stored twice without a removal"
        self.keys[medium].add(key)
        self.records[(medium, key)] = record
        self.calls += 1

    def units_removed(self, medium: str, keys: Sequence[BlockKey]) -> None:
        for key in keys:
            assert key in self.keys.get(medium, set()), "removed a key never stored"
            self.keys[medium].discard(key)
            self.records.pop((medium, key))
        self.calls += 1

    def medium(self, name: str) -> set[BlockKey]:
        return self.keys.get(name, set())


def unit(i: int, version: str | None = "w1") -> tuple[BlockKey, UnitRecord, list]:
    tokens = [i, i + 1]
    key = block_key(ROOT, tokens)
    kv = bytes(LAYOUT.kv_nbytes)
    record = UnitRecord(FORMAT_VERSION, key, ROOT, ROOT, tokens, LAYOUT, checksum(kv), None,
                        weights_version=version)
    return key, record, pack_unit(record, None, kv)


ops = st.lists(st.tuples(st.sampled_from(["add", "remove", "touch"]), st.integers(0, 11), st.integers(1, 40)),
               max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops, st.sampled_from(["lru", "fifo"]))
def test_index_events_replay_to_the_index(script, policy):
    rec = Recorder()
    index = UnitIndex(100, policy, rec, "disk")
    for op, i, size in script:
        key = BlockKey(bytes([i]) * 32)
        if op == "add":
            index.add(key, size)
        elif op == "remove":
            index.remove(key)
        else:
            index.touch(key)
        assert rec.medium("disk") == set(index.list_keys())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "read", "discard"]), st.integers(0, 7)), max_size=50),
       st.booleans())
def test_dram_events_replay_to_the_visible_entries(script, visible):
    rec = Recorder()
    cache = HostCache(3, 8, visible=visible, events=rec)
    for op, i in script:
        key, record, _ = unit(i)
        if op == "write":
            if cache.reserve(key) is not None:
                cache.seal(key, record, None)
                cache.unpin(key)
        elif op == "read":
            if cache.acquire(key) is not None:
                cache.unpin(key)
        else:
            cache.discard(key)
        assert rec.medium("dram") == set(cache.list_keys())
        cache.check_integrity()
    if not visible:
        assert rec.calls == 0  # a staging slab holds nothing a lookup finds
    for key in rec.medium("dram"):
        assert rec.records[("dram", key)].key == key


def test_disk_events_name_records_and_a_restart_announces_what_it_found(tmp_path):
    rec = Recorder()
    disk = DiskStore(tmp_path / "u", 3 * len(b"".join(unit(0)[2])), events=rec)
    for i in range(5):  # the capacity is 3 units: the first two are dropped
        key, _, parts = unit(i)
        assert disk.put(key, parts)
    assert rec.medium("disk") == set(disk.index.list_keys()) and len(rec.medium("disk")) == 3
    assert {rec.records[("disk", k)].token_ids[0] for k in rec.medium("disk")} == {2, 3, 4}
    assert {rec.records[("disk", k)].weights_version for k in rec.medium("disk")} == {"w1"}
    gone = unit(2)[0]
    disk.path_of(gone).unlink()  # deleted behind the store's back: found missing on read
    assert disk.get(gone) is None
    disk.discard(unit(3)[0])  # failed verification
    assert rec.medium("disk") == set(disk.index.list_keys()) == {unit(4)[0]}
    (tmp_path / "u" / "ab").mkdir()
    (tmp_path / "u" / "ab" / f"{'ab' * 32}.unit").write_bytes(b"not a unit")
    again = Recorder()
    restarted = DiskStore(tmp_path / "u", 1 << 20, events=again)
    assert again.medium("disk") == set(restarted.index.list_keys()) == {unit(4)[0], BlockKey(b"\xab" * 32)}
    assert again.records[("disk", unit(4)[0])] == unit(4)[1]
    assert again.records[("disk", BlockKey(b"\xab" * 32))] is None  # unreadable: named by its key alone


def test_redis_events_for_reads_and_adoption_of_another_writers_units(redis_server):
    from execstate.state.tiers.redis_store import RedisStore

    writer = RedisStore(redis_server.url, 1 << 20)  # another replica: no events
    for i in range(4):
        key, _, parts = unit(i, version="w7")
        writer.put(key, parts)
    rec = Recorder()
    reader = RedisStore(redis_server.url, 1 << 20, events=rec)
    assert rec.medium("shared") == set()
    assert reader.get(unit(0)[0]) is not None  # read: now in the reader's index, and announced
    assert reader.adopt([unit(1)[0], unit(2)[0], unit(9)[0]]) == 2  # unit 9 was never written
    assert rec.medium("shared") == set(reader.index.list_keys()) == {unit(i)[0] for i in range(3)}
    for i in range(3):
        assert rec.records[("shared", unit(i)[0])] == unit(i, version="w7")[1]
    writer.discard(unit(1)[0])  # gone from the server: the reader finds it missing
    assert reader.get(unit(1)[0]) is None
    reader.discard(unit(2)[0])
    assert rec.medium("shared") == set(reader.index.list_keys()) == {unit(0)[0]}
    writer.close()
    reader.close()
