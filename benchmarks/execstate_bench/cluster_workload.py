"""The workload of ``execstate bench cluster``: many users, a few long system prompts, multi-turn
chats, some of them as sessions (docs/benchmarks.md).

User ``u`` talks under system prompt ``u % systems`` for ``turns`` turns. A *completion* user
re-sends its whole conversation every turn (system prompt, every earlier user turn and the reply
tokens it got) to ``/v1/completions`` (streamed): its turn ``k`` shares the system prompt with
every user of that system and its own history with its turn ``k - 1``. A *session* user (the
first ``session_users`` users) opens a session and steps it with the system prompt + turn 0,
then each next turn only. Everything is token ids drawn from a seeded generator, so every router
gets exactly the same prompts (the replies, greedy, are the same on every replica).

Tenants (``tenants`` > 1): user ``u`` calls with the API key of tenant ``(u // systems) % tenants``,
so every system prompt is used by every tenant. Each tenant has its own prefix cache, so each
computes each system prompt once: the hit rate against one tenant is the cost of isolation (and
``share_tenants``, one ``--shared-prefix-group`` of them all, buys it back).
:class:`Turn` is one request's record; the client (``cluster_client.py``) fills them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LOW_ID, HIGH_ID = 3, 500  # the tiny models' vocabulary, specials excluded


@dataclass(frozen=True)
class ClusterWorkload:
    users: int = 32
    systems: int = 8
    system_len: int = 1024
    turns: int = 4
    user_len: int = 64
    reply_len: int = 16
    session_users: int = 2
    concurrency: int = 6
    seed: int = 0
    tenants: int = 1
    share_tenants: bool = False

    def __post_init__(self) -> None:
        if min(self.users, self.systems, self.turns, self.concurrency, self.reply_len, self.user_len,
               self.tenants) < 1:
            raise ValueError(f"every workload size must be >= 1: {self}")
        if not 0 <= self.session_users <= self.users:
            raise ValueError(f"session_users must be in [0, users], got {self.session_users}")

    @property
    def requests(self) -> int:
        return self.users * self.turns

    def system_prompt(self, system: int) -> list[int]:
        return _ids((self.seed, 1, system), self.system_len)

    def system_of(self, user: int) -> int:
        return user % self.systems

    def user_turn(self, user: int, turn: int) -> list[int]:
        return _ids((self.seed, 2, user, turn), self.user_len)

    def is_session(self, user: int) -> bool:
        return user < self.session_users

    def tenant_of(self, user: int) -> int:
        return (user // self.systems) % self.tenants

    def key_of(self, tenant: int) -> str:
        """The API key of ``tenant`` (its name: ``tenant-<i>``)."""
        return f"bench-key-of-tenant-{tenant:04d}"

    def headers(self, user: int) -> dict[str, str]:
        return {} if self.tenants == 1 else {"authorization": f"Bearer {self.key_of(self.tenant_of(user))}"}

    def keys_file_text(self) -> str:
        return "".join(f"{self.key_of(t)} tenant-{t}\n" for t in range(self.tenants))

    def sharing(self) -> tuple[str, ...]:
        """The fleet's ``--shared-prefix-group`` values."""
        if not self.share_tenants or self.tenants == 1:
            return ()
        return ("all=" + ",".join(f"tenant-{t}" for t in range(self.tenants)),)


@dataclass
class Turn:
    """One request of the workload as the client saw it (times in seconds from the run's start)."""

    user: int
    turn: int
    kind: str  # "completion" | "session"
    start: float
    ttft: float | None = None  # first token (completions: the first SSE chunk with tokens)
    latency: float | None = None  # whole answer
    tokens: int = 0
    replica: str | None = None
    error: str | None = None


def _ids(key: tuple[int, ...], n: int) -> list[int]:
    return np.random.default_rng(list(key)).integers(LOW_ID, HIGH_ID, n).tolist()
