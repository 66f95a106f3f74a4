"""Manifest encoding/validation and the handshake/commit checks, without processes or NIXL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import blake3
import msgspec
import pytest
import torch
from transfer_harness import BLOCK_SIZE, R3, fill_pool, keys_for, make_caps, make_pool, routes_for

from execstate.transfer.checks import block_checksum, block_checksums, check_compatible, verify_manifest
from execstate.transfer.errors import ErrorCode, TransferError
from execstate.transfer.manifest import (
    FORMAT_VERSION,
    BlockEntry,
    Capabilities,
    Decoder,
    KVLayout,
    Manifest,
    R3Format,
    encode,
)
from execstate_bench.faults import FaultInjection, FaultMode, TruncateTarget, truncate_manifest

POOL = make_pool(8)
CAPS = make_caps("D", POOL)


def _manifest(num_tokens: int = 40, seed: int = 0, **changes) -> Manifest:
    layout = CAPS.kv_layout
    n = -(-num_tokens // BLOCK_SIZE)
    keys = keys_for(num_tokens, seed)
    routes = routes_for(n * BLOCK_SIZE, seed)
    m = Manifest(
        format_version=FORMAT_VERSION,
        source_instance_id="P",
        transfer_id="t1",
        epoch=3,
        provenance_digest=CAPS.provenance_digest,
        kv_layout=layout,
        r3=R3,
        num_tokens=num_tokens,
        blocks=[
            BlockEntry(
                i,
                keys[i],
                layout.block_nbytes,
                bytes(32),
                routes[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE].tobytes(),
            )
            for i in range(n)
        ],
        agent_name="P-nixl",
        agent_metadata=b"md",
        block_addrs=[[4096 * (i + 1)] * (2 * layout.num_layers) for i in range(n)],
    )
    return msgspec.structs.replace(m, **changes)


def _code(exc: pytest.ExceptionInfo[TransferError]) -> ErrorCode:
    return exc.value.code


def test_manifest_roundtrip_is_exact() -> None:
    m = _manifest()
    assert Decoder(Manifest).decode(encode(m)) == m
    assert m.kv_layout.block_nbytes == 2 * 8 * 16 * 4 * 64 * 4
    assert R3Format(8, 2).record_nbytes(16) == 16 * 8 * 2 * 2


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(epoch="3"),  # wrong type
        lambda d: d["blocks"][0].__setitem__(1, b"short"),  # key of the wrong length
        lambda d: d["blocks"][0].__setitem__(3, b"x" * 31),  # checksum of the wrong length
        lambda d: d.update(extra=1),  # unknown field
        lambda d: d.update(type="Nope"),  # unknown tag
        lambda d: d["kv_layout"].update(dtype="int4"),  # dtype outside the wire format
        lambda d: d.update(block_addrs=[[-1]]),  # negative address
    ],
)
def test_malformed_manifest_is_a_protocol_error(mutate) -> None:
    doc = msgspec.msgpack.decode(encode(_manifest()))
    mutate(doc)
    with pytest.raises(TransferError) as e:
        Decoder(Manifest).decode(msgspec.msgpack.encode(doc))
    assert _code(e) is ErrorCode.PROTOCOL


def test_garbage_and_oversized_input() -> None:
    with pytest.raises(TransferError, match="^protocol: malformed"):
        Decoder(Manifest).decode(b"\xc1\x00garbage")
    with pytest.raises(TransferError, match="^protocol: message of"):
        Decoder(Manifest, max_bytes=100).decode(encode(_manifest()))


def _caps(**changes) -> Capabilities:
    return msgspec.structs.replace(CAPS, **changes)


@pytest.mark.parametrize(
    ("remote", "need_routes", "words"),
    [
        (_caps(format_version=1), False, "format version"),
        (_caps(provenance_digest="0" * 64), False, "provenance digest"),
        (make_caps("P", POOL, weights_version="w2"), False, "provenance digest"),
        (_caps(kv_layout=KVLayout(8, 16, 4, 64, "bfloat16")), False, "KV layout"),
        (_caps(kv_layout=KVLayout(8, 32, 4, 64, "float32")), False, "KV layout"),
        (_caps(bulk="tcp-raw"), False, "bulk transport"),
        (_caps(r3=R3Format(8, 4)), False, "R3 format"),
        (_caps(r3=None), True, "R3 is absent on the remote side"),
    ],
)
def test_check_compatible_names_the_mismatch(remote: Capabilities, need_routes: bool, words: str) -> None:
    with pytest.raises(TransferError, match=words) as e:
        check_compatible(CAPS, remote, need_routes)
    assert _code(e) is ErrorCode.INCOMPATIBLE


def test_check_compatible_accepts() -> None:
    check_compatible(CAPS, _caps(instance_id="P"), need_routes=True)
    check_compatible(CAPS, _caps(r3=None), need_routes=False)  # R3 on one side, routes not needed
    with pytest.raises(TransferError, match="absent on the local side"):
        check_compatible(_caps(r3=None), CAPS, need_routes=True)


def test_verify_manifest_accepts_and_checks_ranges() -> None:
    m = _manifest(40)
    keys = keys_for(40, 0)
    verify_manifest(m, "t1", 3, keys, CAPS, need_routes=True)
    verify_manifest(m, "t1", 3, keys[2:], CAPS, start_block=2)
    verify_manifest(m, "t1", 3, keys[:1], CAPS)  # a prefix is enough


@pytest.mark.parametrize(
    ("manifest", "tid", "epoch", "code"),
    [
        (_manifest(), "t0", 3, ErrorCode.STALE_TRANSFER_ID),
        (_manifest(), "t1", 2, ErrorCode.STALE_EPOCH),
        (_manifest(format_version=1), "t1", 3, ErrorCode.INCOMPATIBLE),
        (_manifest(provenance_digest="f" * 64), "t1", 3, ErrorCode.INCOMPATIBLE),
        (_manifest(r3=R3Format(8, 4)), "t1", 3, ErrorCode.INCOMPATIBLE),
        (
            msgspec.structs.replace(_manifest(), num_tokens=60),
            "t1",
            3,
            ErrorCode.TRUNCATED,
        ),  # 4 blocks' worth, 3 listed
        (
            msgspec.structs.replace(_manifest(), num_tokens=20),
            "t1",
            3,
            ErrorCode.BAD_MANIFEST,
        ),  # 2 blocks' worth, 3 listed
        (truncate_manifest(_manifest(), TruncateTarget.BLOCKS), "t1", 3, ErrorCode.TRUNCATED),
        (truncate_manifest(_manifest(), TruncateTarget.ROUTES), "t1", 3, ErrorCode.TRUNCATED),
        (_manifest(block_addrs=[[1, 2]] * 3), "t1", 3, ErrorCode.BAD_MANIFEST),
        (_manifest(agent_name="x", r3=None), "t1", 3, ErrorCode.BAD_MANIFEST),  # routes without R3
    ],
)
def test_verify_manifest_rejects(manifest: Manifest, tid: str, epoch: int, code: ErrorCode) -> None:
    with pytest.raises(TransferError) as e:
        verify_manifest(manifest, tid, epoch, keys_for(40, 0), CAPS)
    assert _code(e) is code, str(e.value)


def test_verify_manifest_rejects_foreign_keys_and_bad_entries() -> None:
    with pytest.raises(TransferError, match="^key_mismatch: block 0"):
        verify_manifest(_manifest(), "t1", 3, keys_for(40, 1), CAPS)
    m = _manifest()
    blocks = list(m.blocks)
    blocks[1] = msgspec.structs.replace(blocks[1], index=5)
    with pytest.raises(TransferError, match="^bad_manifest: block 1 has index 5"):
        verify_manifest(msgspec.structs.replace(m, blocks=blocks), "t1", 3, keys_for(40, 0), CAPS)
    blocks[1] = msgspec.structs.replace(m.blocks[1], nbytes=1)
    with pytest.raises(TransferError, match="^bad_manifest: block 1: 1 bytes"):
        verify_manifest(msgspec.structs.replace(m, blocks=blocks), "t1", 3, keys_for(40, 0), CAPS)
    with pytest.raises(TransferError, match="^truncated: manifest lists 3 blocks, need 4"):
        verify_manifest(m, "t1", 3, keys_for(64, 0), CAPS)
    no_routes = _manifest(r3=None, blocks=[msgspec.structs.replace(b, routes=None) for b in m.blocks])
    verify_manifest(no_routes, "t1", 3, keys_for(40, 0), CAPS)
    with pytest.raises(TransferError, match="manifest carries none"):
        verify_manifest(no_routes, "t1", 3, keys_for(40, 0), CAPS, need_routes=True)


def test_block_checksum_covers_every_byte_of_the_block_only() -> None:
    pool = make_pool(4)
    fill_pool(pool, 5)
    base = block_checksums(pool, [0, 1, 2, 3])
    assert len(set(base)) == 4 and all(len(c) == 32 for c in base)
    k1 = torch.cat([torch.cat([pool.k[layer, 16:32], pool.v[layer, 16:32]]) for layer in range(8)])
    assert (
        base[1]
        == blake3.blake3(  # an independent BLAKE3 over the documented byte order
            b"".join(
                pool.k[layer, 16:32].numpy().tobytes() + pool.v[layer, 16:32].numpy().tobytes()
                for layer in range(8)
            )
        ).digest()
    )
    assert k1.numel() == 2 * 8 * 16 * 4 * 64
    for tensor in (pool.k, pool.v):
        for layer in (0, 7):
            for slot in (16, 31):
                raw = tensor[layer, slot].reshape(-1).view(torch.uint8)
                raw[255] ^= 1  # one bit of one byte
                assert block_checksum(pool, 1) != base[1]
                assert block_checksums(pool, [0, 2, 3]) == [base[0], base[2], base[3]]
                raw[255] ^= 1
    assert block_checksum(pool, 1) == base[1]
    with pytest.raises(ValueError):
        block_checksum(pool, 4)


def test_parallel_checksums_equal_sequential() -> None:
    pool = make_pool(80)
    fill_pool(pool, 6)
    ids = list(range(79, -1, -1))
    with ThreadPoolExecutor(2) as ex:
        assert block_checksums(pool, ids, ex) == block_checksums(pool, ids)
        with pytest.raises(ValueError):
            block_checksums(pool, [*ids, 80], ex)


def test_fault_config_parsing() -> None:
    assert FaultInjection.from_dict(None).mode is None
    f = FaultInjection.from_dict({"mode": "delay", "delay_s": 0.25, "every_n": 2})
    assert f.mode is FaultMode.DELAY and f.delay_s == 0.25
    assert [f.active(i) for i in (1, 2, 3, 4)] == [None, FaultMode.DELAY, None, FaultMode.DELAY]
    assert FaultInjection().active(1) is None
    with pytest.raises(ValueError):
        FaultInjection.from_dict({"mode": "explode"})
    with pytest.raises(ValueError):
        FaultInjection.from_dict({"mode": "drop", "delay": 1})
    with pytest.raises(ValueError):
        FaultInjection.from_dict({"mode": "drop", "every_n": 0})
