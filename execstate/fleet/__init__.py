"""The fleet: execstate replicas behind one router, on Ray Serve (docs/fleet.md).

- :mod:`~execstate.fleet.router`: the router core, pure Python (no Ray, no torch): an index per
  replica rebuilt from its KV events, the scoring policy (execution-compatible prefix, load,
  session affinity, power-of-two fallback) and the subscriber that feeds the indexes;
- :mod:`~execstate.fleet.ray_app` (imports Ray): the Ray Serve application: the OpenAI-compatible
  ingress, the engine replicas and the custom ``RequestRouter`` that asks the core.
"""
