"""An ended world session keeps its status, not its tensors.

The manager remembers the last ended sessions of each kind (their refusals: ``closed``,
``expired``...); on a server a thousand of them are remembered, so whatever an ended session
still references stays in memory for as long as the server runs. Oracle: the tensor bytes
reachable from the ended runtime (the shared store and model excluded) are counted by walking
the object graph, independently of which fields the state has.
"""

from __future__ import annotations

import gc
import types

import pytest
import torch
from world_helpers import run, start_frames, tiny_world_model

from execstate.session.runtime.events import SessionEventError
from execstate.session.world.offline import World
from execstate.session.world.state import WorldStore

LEFT = [("key", {"key": "left", "down": True})]


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


@pytest.fixture
def world(model):
    w = World(model=model, max_sessions=4)
    yield w
    w.close()
    w.sessions.check_integrity()
    assert w.sessions.store.pool.num_used == 0


def tensor_bytes(root: object) -> int:
    """Bytes of the distinct tensor storages reachable from ``root`` (not through the shared
    store or model, modules, classes or functions)."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (WorldStore, torch.nn.Module, types.ModuleType, type,
                                           types.FunctionType, types.BuiltinFunctionType)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            s = o.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
            continue
        stack.extend(gc.get_referents(o))
    return sum(storages.values())


def test_an_ended_session_keeps_no_tensor(world: World) -> None:
    s = world.open_session(prompt="a meadow maze", seed=3, start_frames=start_frames())
    run(s, [LEFT, []])
    s.checkpoint()
    run(s, [[("prompt", {"text": "a snow maze"})]])
    rt = world.sessions.runtime(s.session_id)
    live = tensor_bytes(rt)
    assert live > 0  # the oracle sees the live session's carry, prompt K/V and checkpoints
    s.close()
    ended = world.sessions.runtime(s.session_id)
    assert ended is rt  # remembered, for its refusals
    assert tensor_bytes(rt) == 0
    info = world.sessions.info(s.session_id)
    assert (info.status, info.prompt, info.prompt_version, info.n_chunks) == ("closed", "a snow maze", 1, 4)
    with pytest.raises(SessionEventError) as e:
        s.step()
    assert e.value.code == "closed"


def test_a_fork_outlives_its_ended_parent_with_the_same_frames(world: World) -> None:
    """Releasing the parent's tensors leaves a fork's (its own references) intact: the fork's frames
    equal a twin fork's from a parent that stays open."""
    a = world.open_session(prompt="a meadow maze", seed=5, start_frames=start_frames())
    b = world.open_session(prompt="a meadow maze", seed=5, start_frames=start_frames())
    run(a, [LEFT]), run(b, [LEFT])
    fa, fb = a.fork(a.checkpoint()), b.fork(b.checkpoint())
    a.close()
    assert tensor_bytes(world.sessions.runtime(a.session_id)) == 0
    plan = [[], [("action", {"key": "up"})], [("prompt", {"text": "a snow maze"})]]
    assert run(fa, plan) == run(fb, plan)
