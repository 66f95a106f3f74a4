"""Where a session's manifest lives on the shared tier: one Redis key per (engine, tenant, session).

Pure (no Redis client): the engine that hibernates or copies a session writes its manifest under
:func:`manifest_key` (``manifest_store.py``), and a fleet resuming a lost engine's sessions
computes the same key to find it (``fleet/ray_app/session_resume.py``).
"""

DEFAULT_PREFIX = "execstate:session:v1:"


def manifest_key(engine_id: str, tenant: str, session_id: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Where the manifest of ``session_id`` (of ``tenant``), hibernated or copied by the engine
    ``engine_id``, is stored: ``<prefix><engine id>:<tenant>:<session id>``."""
    return f"{prefix}{engine_id}:{tenant}:{session_id}"
