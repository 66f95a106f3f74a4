"""The session layer's layout (issue 18): the old flat module paths still answer for one release,
with a DeprecationWarning naming the new path and the very same objects; an engine has one owner
of its LM sessions; execstate.LLM is the engine's LLM plus its sessions."""

from __future__ import annotations

import importlib
import sys

import pytest
from session_helpers import GREEDY, make_llm

import execstate
from execstate.engine import llm as engine_llm
from execstate.session.lm.llm import LLM
from execstate.session.lm.sessions import LMSessions
from execstate.session.runtime.sessions import KindSessions

MOVED = {
    "events": "runtime.events", "manager": "runtime.manager", "handle": "runtime.handle",
    "lm_events": "lm.events", "lm_state": "lm.state", "lm_step": "lm.step", "lm_sessions": "lm.sessions",
    "offline": "lm.offline", "async_sessions": "lm.async_sessions", "migration_wire": "lm.migration_wire",
    "migration_state": "lm.migration_state", "migration_source": "lm.migration_source",
    "migration_target": "lm.migration_target", "migration": "lm.migration", "world_events": "world.events",
    "world_state": "world.state", "world_step": "world.step", "world_sessions": "world.sessions",
    "world_offline": "world.offline", "world_async": "world.async_world", "world_migration": "world.migration",
    "world_migration_wire": "world.migration_wire",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_warns_and_reexports_the_new_objects(old, new):
    name = f"execstate.session.{old}"
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=rf"^{name} is deprecated: import from execstate\.session\.{new} "):
        shim = importlib.import_module(name)
    target = importlib.import_module(f"execstate.session.{new}")
    assert shim.__all__
    for attr in shim.__all__:
        want = KindSessions if attr == "SessionOps" else getattr(target, attr)
        assert getattr(shim, attr) is want, attr


@pytest.mark.parametrize(("attr", "module"), [("SessionRuntime", "lifecycle"), ("SessionStatus", "lifecycle"),
                                              ("Checkpoint", "checkpoint"), ("KindState", "checkpoint")])
def test_the_old_runtime_module_names_answer_from_the_package(attr, module):
    import execstate.session.runtime as runtime

    with pytest.warns(DeprecationWarning, match=rf"execstate\.session\.runtime\.{module}"):
        got = getattr(runtime, attr)
    assert got is getattr(importlib.import_module(f"execstate.session.runtime.{module}"), attr)
    with pytest.raises(AttributeError):
        runtime.NoSuchName  # noqa: B018


def test_execstate_llm_is_the_engine_llm_plus_its_sessions(moe_dir):
    assert execstate.LLM is LLM and issubclass(LLM, engine_llm.LLM)
    assert not hasattr(engine_llm.LLM, "open_session")  # the engine layer knows nothing of sessions
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY, session_id="s")
    assert s.sessions is llm.sessions and llm.session("s").info() == s.info()
    with pytest.raises(ValueError, match="already has its LM sessions"):
        LMSessions(llm.engine)  # one owner per engine: capacity and the KV-pressure reclaimer are its
    s.close()
