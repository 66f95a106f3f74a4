"""Sessions: long-lived state advanced step by step, with events, checkpoints, rollback, fork and
migration (docs/contracts.md 6). A runtime plus kinds:

- ``runtime/``: what does not depend on the kind: the status machine, checkpoints, the event
  queue, capacity and eviction, the operations every kind shares (``KindSessions``,
  ``AsyncKindSessions``, ``SessionHandle``) and the kind-agnostic parts of migration;
- ``lm/``: the LM kind (a token context on an ``LLMEngine``);
- ``world/``: the world-model kind (a video world advanced chunk by chunk).

The kinds import the runtime, never each other; the runtime imports no kind. This layer wraps the
engine (the engine never imports it): ``execstate.LLM`` is the engine's ``LLM`` plus its LM
sessions (``lm/llm.py``).

Opening a session::

    from execstate import LLM, World, AsyncSessions, AsyncWorld
    s = LLM("smollm2-moe").open_session()          # lm/offline.py: Session
    w = World().open_session(prompt="a meadow maze", scene_seed=3)    # world/offline.py: WorldSession
    sessions = AsyncSessions(async_engine)          # one per engine, passed to every user of it
    aw = AsyncWorld(world)

Ownership: a kind's sessions object (``LMSessions``, ``WorldSessions``) is built once by its
owner and passed to whoever needs it: ``execstate.LLM`` holds ``llm.sessions``, an
``AsyncSessions`` holds its engine's, a ``World`` holds ``world.sessions``; a server builds one
``AsyncSessions`` per engine (``ServeContext.sessions``). There is no registry: an engine with
sessions has exactly one ``LMSessions`` (a second one raises), which is also the engine's
KV-pressure reclaimer (LRU eviction of idle sessions) and is closed by its owner at shutdown.

Concurrency: one contract, two executors. For both kinds every session operation's bookkeeping
runs serialised by the sessions object's owner, the event loop never waits for a step's compute,
the steps of one session are serialised (a second step while one is in flight is refused
``busy``), and other sessions are unaffected by one session's step. What serialises differs, for
a reason:

- LM: the engine thread. A session's state is the engine's (its KV blocks are lent to the
  request of its step, the step is scheduled and batched with every other request in the same
  engine steps), so its operations run on the engine thread as commands between two engine steps
  (``AsyncSessions.run``); no lock, and nothing else may touch the engine.
- World: an ``RLock`` plus worker threads. A world step is one self-contained chunk computation
  on the ``World``'s own K/V pool, with no scheduler or batching across sessions; its bookkeeping
  takes the lock for microseconds and its compute runs outside the lock on private inputs, on a
  worker thread (``AsyncWorld``, ``step_workers``), so events submitted meanwhile are accepted at
  once and other sessions step in parallel. Putting it on an engine-like command thread would
  serialise every session's chunks behind one another and queue event submissions behind a
  chunk, for no shared state to protect.

The old flat module paths (``execstate.session.lm_sessions``, ``world_offline``, ...) are
deprecated shims that re-export from the new ones for one release.
"""
