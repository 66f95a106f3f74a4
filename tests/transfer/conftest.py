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
def source() -> Iterator[Source]:
    src = Source(SourceConfig())
    yield src
    src.stop()


@pytest.fixture(scope="session")
def source_kv(source: Source) -> tuple[torch.Tensor, torch.Tensor]:
    return source.expected_blocks()


@pytest.fixture(scope="session")
def receiver() -> Receiver:
    pool = make_pool(160)
    bulk = NixlBulk(pool, "D0-nixl", timeout_s=5.0)
    return Receiver(pool, BlockPool(160), bulk, make_caps("D0", pool))
