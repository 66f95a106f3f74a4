"""KV cache events, in one package (docs/fleet.md "KV events").

- ``events.py``: the events in vLLM's shape (``BlockStored``, ``BlockRemoved``,
  ``AllBlocksCleared`` in a ``KVEventBatch``), keyed by execution-state block keys, and the media
  (``pool``, ``dram``, ``disk``, ``shared``);
- ``recorder.py``: ``KVEvents``, what one engine records where its cache changes (the pool, the
  tiers) and publishes once per step; ``build_kv_events`` builds it for the engine, which gives it
  to the block pool and the KV cache manager at their construction;
- ``publisher.py``: the ZeroMQ PUB socket and its replay socket;
- ``config.py``: ``KVEventsConfig`` (vLLM's ``--kv-events-config``);
- ``auth.py``: who may read a feed (loopback, or CURVE keys from the shared secret).
"""
