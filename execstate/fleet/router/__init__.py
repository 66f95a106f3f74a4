"""The router core (docs/fleet.md): pure Python, no Ray and no torch, tested on recorded streams.

- ``block_index.py``: :class:`ReplicaIndex`, one replica's cache as its KV events describe it;
- ``prompt_keys.py``: the execution-state keys a request would look up on a replica;
- ``policy.py``: :class:`RouterKnobs` and :class:`FleetRouter` (the ranking);
- ``subscriber.py``: the ZeroMQ client that keeps the indexes current (live + replay).
"""
