"""Property tests of world sessions: (1) random event sequences at chunk boundaries against a
keyboard oracle (held key, last write wins, every event completed once); (2) random operations
on several sessions (step with events, checkpoint, rollback, fork, release, reset, close): after
every operation every block reference is held exactly once, and every step's frames equal those
of a fresh session replaying that session's history."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from world_helpers import run, start_frames, tiny_world_model

from execstate.session.runtime.events import SessionEventError
from execstate.session.world.offline import World

NAMES = ["up", "down", "left", "right"]
event = st.one_of(
    st.tuples(st.just("key"), st.fixed_dictionaries({"key": st.sampled_from(NAMES), "down": st.booleans()})),
    st.tuples(st.just("action"), st.fixed_dictionaries({"key": st.sampled_from(["none", *NAMES])})),
    st.tuples(st.just("prompt"), st.fixed_dictionaries({"text": st.sampled_from(["meadow", "snow", "lava"])})),
)
plan = st.lists(st.lists(event, max_size=4), min_size=1, max_size=12)


@pytest.fixture(scope="module")
def model():
    return tiny_world_model()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=plan)
def test_boundary_events_follow_the_keyboard_oracle(model, steps) -> None:
    world = World(model=model)
    s = world.open_session(seed=0, start_frames=start_frames())
    held: tuple[str, int] | None = None  # (key, event id of its down)
    prompt, prompt_version = "", 0
    open_ids: set[int] = set()  # submitted, not yet completed
    for events in steps:
        ids = []
        for kind, data in events:
            eid = s.next_event_id()
            s.submit_event(eid, kind, data)
            ids.append((eid, kind, data))
        before = s.info().prompt
        assert before == prompt
        r = s.step()
        # oracle: per kind only the last event of the step applies
        last = {kind: (eid, data) for eid, kind, data in ids}
        done = {eid for eid, kind, _ in ids if last[kind][0] != eid}
        if "key" in last:
            eid, data = last["key"]
            if data["down"] and held is not None and held[0] == data["key"]:
                done.add(eid)  # auto-repeat
            else:
                if held is not None and (data["down"] or held[0] == data["key"]):
                    done.add(held[1])
                    held = None
                if data["down"]:
                    held = (data["key"], eid)
                else:
                    done.add(eid)
        for kind in ("action", "prompt"):
            if kind in last:
                done.add(last[kind][0])
        if "prompt" in last and last["prompt"][1]["text"] != prompt:
            prompt, prompt_version = last["prompt"][1]["text"], prompt_version + 1
        keys = (last["action"][1]["key"],) * 2 if "action" in last else ((held[0] if held else "none"),) * 2
        assert r.keys == keys
        assert r.events["started"] == sorted(last[k][0] for k in last)
        assert r.events["active"] == ([held[1]] if held else [])
        assert r.events["completed"] == sorted(done)
        assert r.prompt_version == prompt_version
        open_ids |= {eid for eid, _, _ in ids}
        assert done <= open_ids  # completed once: never again
        open_ids -= done
    assert open_ids == ({held[1]} if held else set())
    world.close()
    world.sessions.check_integrity()


op = st.one_of(
    st.tuples(st.just("step"), st.integers(0, 5), st.lists(event, max_size=3)),
    st.tuples(st.just("step"), st.integers(0, 5), st.lists(event, max_size=3)),
    st.tuples(st.just("step"), st.integers(0, 5), st.lists(event, max_size=3)),
    st.tuples(st.just("open"), st.integers(0, 3)),
    st.tuples(st.just("checkpoint"), st.integers(0, 5)),
    st.tuples(st.just("rollback"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("fork"), st.integers(0, 5), st.integers(-1, 5)),
    st.tuples(st.just("release"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("reset"), st.integers(0, 5)),
    st.tuples(st.just("close"), st.integers(0, 5)),
)


def _pick(items, i):
    return items[i % len(items)] if items else None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=3, max_size=25))
def test_random_operations_keep_accounting_and_replay_equality(model, ops) -> None:
    world, ref = World(model=model, max_sessions=5, eviction="lru"), World(model=model)
    # (session, {"seed", "history", "origin": the history reset returns to without checkpoints, "cps"})
    live: list[tuple[object, dict]] = []
    try:
        for o in [("open", 0), *ops]:
            entry = _pick(live, o[1]) if o[0] != "open" else None
            s, meta = entry if entry else (None, None)
            try:
                if o[0] == "open":
                    s = world.open_session(seed=o[1], start_frames=start_frames(seed=o[1]))
                    live.append((s, {"seed": o[1], "history": [], "origin": [], "cps": {}}))
                elif s is None:
                    continue
                elif o[0] == "step":
                    got = run(s, [o[2]])
                    meta["history"].append(o[2])
                    fresh = ref.open_session(seed=meta["seed"], start_frames=start_frames(seed=meta["seed"]))
                    assert run(fresh, meta["history"])[-1] == got[-1]
                    fresh.close()
                elif o[0] == "checkpoint":
                    meta["cps"][s.checkpoint().checkpoint_id] = list(meta["history"])
                elif o[0] in ("rollback", "release", "fork") and (meta["cps"] or o[0] == "fork"):
                    cp_id = _pick(sorted(meta["cps"]), o[2]) if o[0] != "fork" or o[2] >= 0 else None
                    if o[0] == "rollback":
                        s.rollback(cp_id)
                        meta["history"] = list(meta["cps"][cp_id])
                    elif o[0] == "release":
                        s.release_checkpoint(cp_id)
                        meta["cps"].pop(cp_id)
                    else:
                        hist = meta["history"] if cp_id is None else meta["cps"][cp_id]
                        live.append((s.fork(cp_id), {"seed": meta["seed"], "history": list(hist),
                                                     "origin": list(hist), "cps": {}}))
                elif o[0] == "reset":
                    s.reset()
                    newest = max(meta["cps"], key=lambda c: int(c[3:])) if meta["cps"] else None
                    meta["history"] = list(meta["origin"] if newest is None else meta["cps"][newest])
                elif o[0] == "close":
                    s.close()
                    live.remove(entry)
            except SessionEventError as exc:
                assert exc.code in {"evicted", "capacity"}, exc
                if exc.code == "evicted":
                    live.remove(entry)
            live = [(x, m) for x, m in live if x.status not in ("evicted", "closed")]
            world.sessions.check_integrity()
    finally:
        world.close()
        ref.close()
    world.sessions.check_integrity()
    assert world.sessions.store.pool.num_used == 0


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.sampled_from(
        ["left", "up", "none", "jump", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["key", "down", "keys", "text", "delta", "deltas", "events", "kind", "data", "x"]), inner,
        max_size=3),
    max_leaves=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["key", "action", "camera", "prompt", "composite", "other"]), data=json_value)
def test_any_payload_is_accepted_or_refused_invalid(model, kind, data) -> None:
    world = World(model=model)
    s = world.open_session(seed=0, start_frames=start_frames())
    try:
        s.submit_event(0, kind, data)
    except SessionEventError as e:
        assert e.code == "invalid" and e.message
    r = s.step()  # whatever was accepted applies cleanly
    assert r.frames.shape == (2, 24, 24, 3)
    world.close()
    world.sessions.check_integrity()
