"""The session layer's layout: an engine has one owner of its LM sessions; execstate.LLM is the
engine's LLM plus its sessions."""

from __future__ import annotations

import pytest
from session_helpers import GREEDY, make_llm

import execstate
from execstate.engine import llm as engine_llm
from execstate.engine.session_port import SessionPort
from execstate.session.lm.llm import LLM
from execstate.session.lm.sessions import LMSessions


def test_execstate_llm_is_the_engine_llm_plus_its_sessions(moe_dir):
    assert execstate.LLM is LLM and issubclass(LLM, engine_llm.EngineLLM)
    assert not hasattr(engine_llm.EngineLLM, "open_session")  # the engine layer knows nothing of sessions
    llm = make_llm(moe_dir)
    s = llm.open_session(sampling_params=GREEDY, session_id="s")
    assert s.sessions is llm.sessions and llm.session("s").info() == s.info()
    with pytest.raises(ValueError, match="already has its LM sessions"):
        # one owner per engine: capacity and the KV-pressure reclaimer are its
        LMSessions(llm.engine, SessionPort(llm.engine))
    s.close()
