"""Session options: EngineConfig validation and the ``serve`` flags with their documented defaults."""

from __future__ import annotations

import pytest

from execstate.cli import _SESSION_DEFAULTS, build_parser
from execstate.engine.config import EngineConfig
from execstate.serve.server import engine_config_from_args


def test_serve_flags_default_to_the_engine_config_defaults():
    cfg, defaults = engine_config_from_args(build_parser().parse_args(["serve", "m"])), EngineConfig(model="m")
    assert (cfg.max_sessions, cfg.session_eviction, cfg.max_session_events) == (
        defaults.max_sessions, defaults.session_eviction, defaults.max_session_events) == (64, None, 64)
    assert _SESSION_DEFAULTS == {"max_sessions": 64, "session_eviction": "none", "max_session_events": 64}
    args = build_parser().parse_args(["serve", "m", "--max-sessions", "3", "--session-eviction", "lru",
                                      "--max-session-events", "5"])
    cfg = engine_config_from_args(args)
    assert (cfg.max_sessions, cfg.session_eviction, cfg.max_session_events) == (3, "lru", 5)


@pytest.mark.parametrize("kw", [dict(max_sessions=0), dict(max_session_events=0), dict(session_eviction="fifo")])
def test_bad_session_options_are_refused(kw):
    with pytest.raises(ValueError):
        EngineConfig(model="m", **kw)
