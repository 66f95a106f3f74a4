from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from transfer_harness import Source, SourceConfig, make_caps, make_pool

from execstate.state.block_pool import BlockPool
from execstate.state.kv_pool import KVPool
from execstate.transfer.bulk import NixlBulk
from execstate.transfer.manifest import Capabilities


@dataclass
class Receiver:
    pool: KVPool
    block_pool: BlockPool
    bulk: NixlBulk
    caps: Capabilities


@pytest.fixture(scope="session")
def source_processes() -> Iterator[tuple[Source, Source]]:
    """Two source (prefill) processes started in parallel: one shared by the two-process tests,
    one for the test that kills it."""
    shared, doomed = Source(SourceConfig()), Source(SourceConfig(instance_id="P-kill"))
    yield shared, doomed
    shared.stop()
    doomed.stop()


@pytest.fixture(scope="session")
def source_process(source_processes: tuple[Source, Source]) -> Source:
    return source_processes[0]


@pytest.fixture
def doomed_source(source_processes: tuple[Source, Source]) -> Source:
    return source_processes[1]


@pytest.fixture(scope="session")
def source_kv(source_process: Source) -> tuple[torch.Tensor, torch.Tensor]:
    """An independent regeneration of the source pool's K and V."""
    return source_process.expected_blocks()


@pytest.fixture(scope="session")
def receiver_session() -> Receiver:
    pool = make_pool(160)
    bulk = NixlBulk(pool, "D0-nixl", timeout_s=5.0)
    return Receiver(pool, BlockPool(160), bulk, make_caps("D0", pool))


@pytest.fixture
def receiver(receiver_session: Receiver) -> Iterator[Receiver]:
    """The receiver (this process); after each test its pool must be clean."""
    yield receiver_session
    receiver_session.block_pool.check_integrity()
    assert receiver_session.block_pool.num_used == 0
    assert receiver_session.bulk.num_stuck == 0


@pytest.fixture
def source(source_process: Source, receiver: Receiver) -> Iterator[Source]:
    """The source with a fresh exporter (default limits); after each test nothing stays pinned
    except what the test left in flight on purpose (released by the next test's setup)."""
    source_process.setup()
    yield source_process
