"""A migration checks the session's owner before any outbound call.

Another tenant's ``POST /v1/sessions/{id}/migrate`` of a session it does not own, or anyone's of
an id that never existed, is a 404 ``not_found`` and the allow-listed target hears nothing; before,
the source first asked the target to ``identify`` itself and answered 502 when it could not. The
owner's own migrate still reaches the target (here a recorder that answers 502 to everything,
so the hand-over fails and the session stays served at the source).
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from security_helpers import KEY_A, KEY_B, Recorder, code_of, http, keys_of, server, serving

from execstate.engine.pd_connector import PDConfig
from execstate.serve.sessions.handover import IDENTIFY_PATH

SECRET = "migrate-owner-first-secret-0123456789"


@pytest.fixture(scope="module")
def source(model_dir, tmp_path_factory):
    trap = Recorder()
    keys = keys_of(tmp_path_factory.mktemp("keys") / "keys", a=KEY_A, b=KEY_B)
    with ExitStack() as stack:
        trap_url = stack.enter_context(serving(trap.app))
        s = stack.enter_context(server(model_dir, pd=PDConfig(role="kv_both", secret=SECRET, engine_id="s-1",
                                                               timeout_s=5.0), keys=keys,
                                       migration_targets=[trap_url]))
        assert http("POST", f"{s.url}/v1/sessions", KEY_A, {"session_id": "mine"}).status_code == 200
        assert http("POST", f"{s.url}/v1/sessions/mine/step", KEY_A, {"input": list(range(20, 40)),
                                                                        "max_tokens": 2}).status_code == 200
        yield s.url, trap_url, trap


@pytest.mark.parametrize(("key", "sid"), [(KEY_B, "mine"), (KEY_A, "never-existed"), (KEY_B, "never-existed")])
def test_not_the_owner_is_a_404_and_the_target_hears_nothing(source, key, sid):
    url, trap_url, trap = source
    trap.requests.clear()
    r = http("POST", f"{url}/v1/sessions/{sid}/migrate", key, {"target": trap_url, "timeout_s": 5})
    assert (r.status_code, code_of(r)) == (404, "not_found"), r.text
    assert trap.requests == [], f"the source contacted the target: {[p for _, p, _, _ in trap.requests]}"


def test_the_owner_still_reaches_the_target(source):
    url, trap_url, trap = source
    trap.requests.clear()
    r = http("POST", f"{url}/v1/sessions/mine/migrate", KEY_A, {"target": trap_url, "timeout_s": 5})
    assert r.status_code == 502, r.text  # the recorder answers 502: the target cannot identify itself
    assert [p for _, p, _, _ in trap.requests] == [IDENTIFY_PATH]
    assert http("GET", f"{url}/v1/sessions/mine", KEY_A).json()["status"] == "open"
