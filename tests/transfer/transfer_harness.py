"""Two-process harness for transfer tests: a source (prefill) process driven over a pipe.

The source process owns its KV pool (filled with seeded random K/V), block pool, NIXL agent,
exporter and control server; its main loop plays the engine thread (commands + ``poll`` every
tick) while the control server thread answers the receiver. The test process is the receiver.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from dataclasses import dataclass, field

import numpy as np
import torch

from execstate.identity.execution import ExecutionIdentity
from execstate.identity.keys import BlockKey, block_key
from execstate.identity.provenance import Provenance
from execstate.state.block_pool import BlockPool
from execstate.state.kv_pool import KVPool
from execstate.transfer.checks import kv_layout_of
from execstate.transfer.manifest import FORMAT_VERSION, Capabilities, R3Format

# The standard layout: 8 layers, 16-token blocks, 4 KV heads, head_dim 64, fp32; 8 MoE layers top-2.
NUM_LAYERS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM = 8, 16, 4, 64
N_MOE_LAYERS, TOP_K, N_EXPERTS = 8, 2, 8
R3 = R3Format(n_moe_layers=N_MOE_LAYERS, top_k=TOP_K)


def provenance(weights_version: str = "w1") -> Provenance:
    return Provenance("test/moe", weights_version, "float32", "eager+torch-cpu")


def make_pool(num_blocks: int, head_dim: int = HEAD_DIM) -> KVPool:
    return KVPool(NUM_LAYERS, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, head_dim, torch.float32)


def fill_pool(pool: KVPool, seed: int) -> None:
    k, v = expected_kv(pool.k.shape, seed)
    pool.k.copy_(k)
    pool.v.copy_(v)


def expected_kv(shape: torch.Size, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def make_caps(instance_id: str, pool: KVPool, weights_version: str = "w1", r3: bool = True) -> Capabilities:
    return Capabilities(
        format_version=FORMAT_VERSION,
        instance_id=instance_id,
        provenance_digest=provenance(weights_version).digest(),
        kv_layout=kv_layout_of(pool),
        r3=R3 if r3 else None,
    )


def tokens(num_tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 32000, size=num_tokens, dtype=np.int64)


def keys_for(num_tokens: int, token_seed: int, weights_version: str = "w1") -> list[BlockKey]:
    """Keys of every block of the sequence; a partial tail is keyed by its own tokens."""
    toks = tokens(num_tokens, token_seed)
    prov = provenance(weights_version)
    keys = ExecutionIdentity(prov).chain(toks, BLOCK_SIZE)
    if num_tokens % BLOCK_SIZE:
        parent = keys[-1] if keys else ExecutionIdentity(prov).root
        keys.append(block_key(parent, toks[len(keys) * BLOCK_SIZE :]))
    return keys


def routes_for(num_rows: int, seed: int) -> np.ndarray:
    """int16 [num_rows, N_MOE_LAYERS, TOP_K]: distinct experts per row."""
    scores = np.random.default_rng(seed + 1).random((num_rows, N_MOE_LAYERS, N_EXPERTS))
    return np.argsort(scores, axis=-1)[..., :TOP_K].astype(np.int16)


# -- commands (test -> source) and replies ------------------------------------------------------


@dataclass(frozen=True)
class SourceConfig:
    instance_id: str = "P0"
    weights_version: str = "w1"
    num_blocks: int = 160
    seed: int = 1234
    r3: bool = True
    max_inflight: int = 64
    max_bytes: int = 1 << 34
    ttl_s: float = 60.0


@dataclass(frozen=True)
class Setup:
    """Replace exporter + control server (old transfers invalidated); reply: control address."""

    max_inflight: int = 64
    max_bytes: int = 1 << 34
    ttl_s: float = 60.0


@dataclass(frozen=True)
class Export:
    transfer_id: str
    num_tokens: int
    token_seed: int
    with_routes: bool = True
    epoch: int | None = None  # None: the exporter's current epoch


@dataclass(frozen=True)
class ExportReply:
    block_ids: list[int]
    epoch: int
    error: str | None


@dataclass(frozen=True)
class Invalidate:
    pass


@dataclass(frozen=True)
class Poll:
    advance_s: float = 0.0


@dataclass(frozen=True)
class Query:
    pass


@dataclass(frozen=True)
class SourceState:
    num_used: int
    num_inflight: int
    epoch: int
    stats: dict[str, int] = field(default_factory=dict)
    released: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Stop:
    pass


def source_main(conn, cfg: SourceConfig) -> None:  # runs in the source process
    import dataclasses
    import time

    from execstate.transfer.bulk import NixlBulk
    from execstate.transfer.control import ControlServer
    from execstate.transfer.errors import TransferError
    from execstate.transfer.exporter import KVExporter

    pool = make_pool(cfg.num_blocks)
    fill_pool(pool, cfg.seed)
    block_pool = BlockPool(cfg.num_blocks)
    bulk = NixlBulk(pool, f"{cfg.instance_id}-nixl")
    caps = make_caps(cfg.instance_id, pool, cfg.weights_version, cfg.r3)
    released: list[tuple[str, str]] = []

    def build(setup: Setup) -> tuple[KVExporter, ControlServer]:
        exp = KVExporter(pool, block_pool, caps, bulk, setup.max_inflight, setup.max_bytes, setup.ttl_s)
        return exp, ControlServer("127.0.0.1", 0, exp)

    exporter, server = build(Setup(cfg.max_inflight, cfg.max_bytes, cfg.ttl_s))
    conn.send(server.addr)
    while True:
        ready = conn.poll(0.01)
        released += [(r.transfer_id, r.reason.value) for r in exporter.poll()]  # each engine step
        if ready:
            cmd = conn.recv()
            match cmd:
                case Setup():
                    released += [(r.transfer_id, r.reason.value) for r in exporter.invalidate_all()]
                    server.close()
                    exporter, server = build(cmd)
                    reply: object = server.addr
                case Export():
                    n = -(-cmd.num_tokens // BLOCK_SIZE)
                    epoch = exporter.epoch if cmd.epoch is None else cmd.epoch
                    ids = block_pool.allocate(n)  # the "request" that computed the blocks
                    routes = routes_for(cmd.num_tokens, cmd.token_seed) if cmd.with_routes else None
                    keys = keys_for(cmd.num_tokens, cmd.token_seed, cfg.weights_version)
                    error = None
                    try:
                        exporter.export(cmd.transfer_id, epoch, ids, keys, routes, cmd.num_tokens)
                    except TransferError as e:
                        error = str(e)
                    block_pool.free(reversed(ids))  # the request finishes; only the export pins remain
                    reply = ExportReply([int(b) for b in ids], epoch, error)
                case Invalidate():
                    released += [(r.transfer_id, r.reason.value) for r in exporter.invalidate_all()]
                    reply = exporter.epoch
                case Poll():
                    released += [
                        (r.transfer_id, r.reason.value)
                        for r in exporter.poll(time.monotonic() + cmd.advance_s)
                    ]
                    reply = None
                case Query():
                    released += [(r.transfer_id, r.reason.value) for r in exporter.poll()]
                    reply = SourceState(
                        block_pool.num_used,
                        exporter.num_inflight,
                        exporter.epoch,
                        dataclasses.asdict(exporter.stats),
                        list(released),
                    )
                case Stop():
                    server.close()
                    conn.send(None)
                    return
            conn.send(reply)
        exporter.check_integrity()
        block_pool.check_integrity()


class Source:
    """Handle on a source process; construction only starts it (sources start in parallel),
    the first command waits until it is ready."""

    def __init__(self, cfg: SourceConfig) -> None:
        ctx = mp.get_context("spawn")
        self.cfg = cfg
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=source_main, args=(child, cfg), daemon=True)
        self.process.start()
        self._addr: str | None = None

    @property
    def addr(self) -> str:
        """The control server's address (waits for the process to be ready)."""
        if self._addr is None:
            if not self._conn.poll(60):
                raise RuntimeError("source process did not start")
            self._addr = self._conn.recv()
        return self._addr

    def call(self, cmd: object, timeout_s: float = 30.0):
        assert self.addr
        self._conn.send(cmd)
        if not self._conn.poll(timeout_s):
            raise RuntimeError(f"source did not answer {cmd}")
        return self._conn.recv()

    def export(self, transfer_id: str, num_tokens: int, token_seed: int, **kw) -> ExportReply:
        return self.call(Export(transfer_id, num_tokens, token_seed, **kw))

    def setup(self, **kw) -> str:
        self._addr = self.call(Setup(**kw))
        return self._addr

    def query(self) -> SourceState:
        return self.call(Query())

    def expected_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = torch.Size((NUM_LAYERS, self.cfg.num_blocks * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM))
        return expected_kv(shape, self.cfg.seed)

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(RuntimeError, OSError, EOFError):
                self.call(Stop(), timeout_s=10)
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
