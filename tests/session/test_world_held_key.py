"""The key a world session holds once its pending events apply (``WorldSessionInfo.held_key_after_pending``):
the runtime's answer, which the world WebSocket uses after a rollback instead of a copy of its own."""

from __future__ import annotations

import pytest
from world_helpers import start_frames, tiny_world_model

from execstate.session.world.offline import World


@pytest.fixture(scope="module")
def world():
    w = World(model=tiny_world_model(), max_sessions=2)
    yield w
    w.close()


def test_pending_key_events_fold_like_the_next_boundary(world: World) -> None:
    s = world.open_session(seed=0, start_frames=start_frames())
    assert (s.info().held_key, s.info().held_key_after_pending) == (None, None)
    s.submit_event(0, "key", {"key": "up", "down": True})
    assert (s.info().held_key, s.info().held_key_after_pending) == (None, "up")  # queued, not applied
    s.step()
    assert (s.info().held_key, s.info().held_key_after_pending) == ("up", "up")
    s.submit_event(1, "key", {"key": "left", "down": True})
    s.submit_event(2, "action", {"key": "down"})  # this chunk only: the held key stays
    assert s.info().held_key_after_pending == "left"
    s.submit_event(3, "key", {"key": "left", "down": False})  # the last key event is the one applied
    assert s.info().held_key_after_pending == "up"  # releasing left, which the boundary never held
    s.step()
    assert s.info().held_key == s.info().held_key_after_pending == "up"
    s.submit_event(4, "composite", {"events": [{"kind": "prompt", "data": {"text": "snow"}},
                                               {"kind": "key", "data": {"key": "up", "down": False}}]})
    assert s.info().held_key_after_pending is None
    s.close()


def test_after_a_rollback_the_checkpoints_pending_events_count(world: World) -> None:
    s = world.open_session(seed=1, start_frames=start_frames())
    s.step()
    s.submit_event(0, "key", {"key": "right", "down": True})
    cp = s.checkpoint()  # the key.down is pending in the checkpoint
    s.step()
    s.submit_event(1, "key", {"key": "right", "down": False})
    s.step()
    assert s.info().held_key_after_pending is None
    s.rollback(cp)
    info = s.info()
    assert (info.held_key, info.num_pending_events, info.held_key_after_pending) == (None, 1, "right")
    keys = s.step().keys
    assert keys == ("right",) * len(keys)
    s.close()
