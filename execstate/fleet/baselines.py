"""The routers execstate's is measured against (``execstate bench cluster``; docs/fleet.md).

Pure Python, ranking :class:`~execstate.fleet.router.policy.ReplicaView`\\ s like the core:

- :class:`RoundRobin`: the next replica in turn;
- power of two choices: ``FleetRouter.power_of_two`` (Ray Serve's default router's procedure);
- :class:`TextPrefixAffinity`: the algorithm of Ray Serve's ``PrefixCacheAffinityRouter``
  (``ray.llm``; it needs Ray's LLM stack, so it is reimplemented here): remember the prompts sent
  to each replica; when the load is balanced (queue spread at most ``imbalanced_threshold``),
  send a prompt to the replica whose remembered prompts share the longest prefix with it, if that
  prefix is at least ``match_rate_threshold`` of the prompt, else to the replica that was sent
  the fewest tokens; when imbalanced, power of two. It matches token ids, not execution state:
  a replica on another weights version or a request under another tenant's salt still matches.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from execstate.fleet.router.policy import ReplicaView

MAX_REMEMBERED = 256  # prompts remembered per replica (the oldest are forgotten)


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def rank(self, replicas: Sequence[ReplicaView]) -> list[list[str]]:
        ids = sorted(r.replica_id for r in replicas)
        if not ids:
            return []
        start = self._next % len(ids)
        self._next += 1
        return [[rid] for rid in ids[start:] + ids[:start]]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TextPrefixAffinity:
    def __init__(self, rng: random.Random | None = None, imbalanced_threshold: float = float("inf"),
                 match_rate_threshold: float = 0.1) -> None:
        self.rng = rng or random.Random()
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self._prompts: dict[str, deque[tuple[int, ...]]] = {}
        self._tokens: dict[str, int] = {}

    def rank(self, token_ids: Sequence[int] | None, replicas: Sequence[ReplicaView]) -> list[list[str]]:
        if not replicas:
            return []
        by_load = sorted(replicas, key=lambda r: r.load)
        queues = [r.queue_len for r in replicas]
        if not token_ids or max(queues) - min(queues) > self.imbalanced_threshold:
            pair = self.rng.sample(list(replicas), min(2, len(replicas)))
            pair.sort(key=lambda r: r.load)
            chosen = [r.replica_id for r in pair]
        else:
            best, matched = [], 0
            for r in replicas:
                m = max((_common_prefix(token_ids, p) for p in self._prompts.get(r.replica_id, ())), default=0)
                if m > matched:
                    best, matched = [r.replica_id], m
                elif m == matched:
                    best.append(r.replica_id)
            if matched / len(token_ids) < self.match_rate_threshold:
                fewest = min(self._tokens.get(r.replica_id, 0) for r in replicas)
                best = [r.replica_id for r in replicas if self._tokens.get(r.replica_id, 0) == fewest]
            load = {r.replica_id: r.load for r in replicas}
            chosen = sorted(best, key=lambda rid: load[rid])
            self.remember(chosen[0], token_ids)
        rest = [r.replica_id for r in by_load if r.replica_id not in chosen]
        return [[rid] for rid in chosen + rest]

    def remember(self, replica_id: str, token_ids: Sequence[int]) -> None:
        q = self._prompts.setdefault(replica_id, deque(maxlen=MAX_REMEMBERED))
        q.append(tuple(token_ids))
        self._tokens[replica_id] = self._tokens.get(replica_id, 0) + len(token_ids)
