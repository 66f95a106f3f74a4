"""Offload tiers under the KV pool: DRAM, local disk and a shared store (docs/offload.md; docs/contracts.md 3).

The unit that moves between tiers is the consistency unit of docs/contracts.md 3: one full
block's KV in every layer, its route rows (MoE with route return) and its record (key, parent key,
provenance root, token ids, checksums), stored under the block's execution-state key
(:mod:`~execstate.state.tiers.unit`). Pure bookkeeping lives here (no torch):

- :mod:`~execstate.state.tiers.host_cache`: the DRAM tier, a bounded host buffer of unit slots;
- :mod:`~execstate.state.tiers.store`: the interface of every other tier (:class:`UnitStore`),
  its contract, and the LRU/FIFO index those tiers share;
- :mod:`~execstate.state.tiers.disk_store`, :mod:`~execstate.state.tiers.redis_store`: local
  files, a Redis server;
- :mod:`~execstate.state.tiers.pool_units`: what the pool's cached blocks were computed from
  (parent key, root, tokens), so an evicted block can be written back with its record;
- :mod:`~execstate.state.tiers.stats`: per-tier counters for ``/metrics``;
- :mod:`~execstate.state.tiers.unit_events`: where each tier reports the units it starts or
  stops holding (the engine's KV events, medium ``dram`` / ``disk`` / ``shared``).

The movers (write-back on eviction, verified asynchronous reload) are in ``transfer/``
(``offload_writer.py``, ``offload_loader.py``, ``unit_checks.py``); the engine wires them in
``engine/offload.py``.
"""
