"""The former import paths of serve/ keep working for one release: each warns (DeprecationWarning
naming the new path) and gives the objects of the new modules."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

# old module -> (new module, names that must be the same objects)
MOVED = {
    "agent_convert": ("realtime.agent.convert", ["agent_config", "event_json", "MAX_RESPONSE_TOKENS"]),
    "agent_protocol": ("realtime.agent.messages", ["SessionCreate", "AgentSessionConfig", "InputAppend"]),
    "agent_tools": ("realtime.agent.tools", ["AgentTools", "DEMO_TABLE", "calculator", "make_lookup"]),
    "agent_ws": ("realtime.agent.endpoint", ["AgentServer", "TaskKeeper", "install_agent", "PATH"]),
    "agent_conn": ("realtime.agent.handlers", ["AgentHandlers", "DEFAULT_INSTRUCTIONS"]),
    "proxy": ("pd.proxy", ["build_proxy_app", "run_proxy"]),
    "realtime_protocol": ("realtime.lm.messages", ["SessionCreate", "EventSubmit", "SessionConfig"]),
    "realtime_registry": ("realtime.lm.owners", ["SessionOwners"]),
    "world_conn": ("realtime.world.handlers", ["WorldHandlers"]),
    "world_driver": ("realtime.world.host", ["WorldHost", "session_blocks_for"]),
    "world_encode": ("realtime.world.encode", ["encode_chunk", "decode_chunk", "frame_sha256"]),
    "world_protocol": ("realtime.world.messages", ["SessionStart", "KeyDown", "error_event", "MAX_PROMPT_CHARS"]),
    "world_server": ("realtime.world.app", ["build_world_app", "run_world_server", "world_host_from_args"]),
    "world_ws": ("realtime.world.endpoint", ["install_world", "WorldServer", "page_html", "PATH"]),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_warns_and_reexports(old):
    new, names = MOVED[old]
    sys.modules.pop(f"execstate.serve.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"execstate.serve.{new}"):
        shim = importlib.import_module(f"execstate.serve.{old}")
    target = importlib.import_module(f"execstate.serve.{new}")
    for name in names:
        assert getattr(shim, name) is getattr(target, name), name


def test_old_helpers_behave_as_before():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from execstate.serve import agent_protocol, realtime_protocol, world_protocol, world_server
        from execstate.serve.realtime import errors
        from execstate.serve.realtime.world.app import world_model_from_option
    assert realtime_protocol.ProtocolError is world_protocol.WorldProtocolError is errors.ProtocolError
    assert realtime_protocol.MAX_MESSAGE_BYTES == 1 << 20 and world_protocol.MAX_MESSAGE_BYTES == 64 << 10
    assert "session.create" in realtime_protocol.CLIENT_TYPES and "key.down" in world_protocol.CLIENT_TYPES
    msg = agent_protocol.parse_client_message('{"type": "session.close", "event_id": 3}')
    assert agent_protocol.type_of(msg) == "session.close" and msg.event_id == 3
    with pytest.raises(errors.ProtocolError) as info:
        world_protocol.parse_client_message('{"type": "session.ping", "event_id": ""}')
    assert info.value.code == "invalid_message"
    assert world_server.load_world_model is world_model_from_option


@pytest.mark.parametrize(("name", "new"), [("install_realtime", "lm.endpoint"), ("RealtimeServer", "lm.endpoint"),
                                           ("MAX_UNPROCESSED_MESSAGES", "limits"), ("Outbox", "outbox")])
def test_names_of_the_former_realtime_module(name, new):
    import execstate.serve.realtime as package

    with pytest.warns(DeprecationWarning, match=f"execstate.serve.realtime.{new}.{name}"):
        value = getattr(package, name)
    assert value is getattr(importlib.import_module(f"execstate.serve.realtime.{new}"), name)
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018
