"""Migration once could be redirected and replayed, and a failed one cloned the session.

Reproduces, with three servers sharing the handoff secret (S the source, T a listed target, B
another instance) and a recording proxy P in front of T:

- *redirected*: ``POST /v1/sessions/{id}/migrate {"target": <any URL>}`` sent the session's offer,
  and S's own API key (``authorization: Bearer``), to that URL. Now a target outside
  ``--migration-targets`` is refused (``403 target_not_allowed``) and nothing is sent; no request
  of the hand-over carries an API key;
- *replayed*: the offer captured on its way to T was accepted by B (200: the session then lived
  on both). Now the offer is bound to T's engine id and its nonce: B refuses it
  (``wrong_target``), T refuses it again (``replay``);
- *cloned*: when T's answer was lost (P answers 500 after forwarding the offer), S served the
  session again while T served its copy too. Now T imports without serving, S asks it to abort
  and serves again only once T confirmed: exactly one server serves the session.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from security_helpers import KEY_A, Recorder, code_of, http, serving

from execstate.engine.pd_connector import PDConfig

SECRET = "finding-3-shared-secret-0123456789"
SAMPLING = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
PROMPT = list(range(20, 60))


def serves(url: str, sid: str) -> bool:
    r = http("GET", f"{url}/v1/sessions/{sid}", KEY_A)
    return r.status_code == 200 and r.json()["status"] in ("open", "stepping")


@pytest.fixture(scope="module")
def cluster(model_dir):
    from security_helpers import server

    proxy = Recorder()
    with ExitStack() as stack:
        p_url = stack.enter_context(serving(proxy.app))
        t = stack.enter_context(server(model_dir, pd=PDConfig(role="kv_both", secret=SECRET, engine_id="t-1",
                                                               timeout_s=5.0), api_key=KEY_A))
        b = stack.enter_context(server(model_dir, pd=PDConfig(role="kv_both", secret=SECRET, engine_id="b-1",
                                                               timeout_s=5.0), api_key=KEY_A))
        s = stack.enter_context(server(model_dir, pd=PDConfig(role="kv_both", secret=SECRET, engine_id="s-1",
                                                               timeout_s=5.0), api_key=KEY_A,
                                       migration_targets=[p_url]))
        proxy.upstream = t.url
        yield s.url, t.url, b.url, p_url, proxy


def open_and_step(url: str, sid: str) -> None:
    assert http("POST", f"{url}/v1/sessions", KEY_A, {"session_id": sid, "sampling": SAMPLING}).status_code == 200
    assert http("POST", f"{url}/v1/sessions/{sid}/step", KEY_A, {"input": PROMPT}).status_code == 200


def test_a_target_outside_the_allow_list_gets_nothing(cluster):
    s, _, _, _, _ = cluster
    trap = Recorder()  # answers 502 to whatever reaches it
    with serving(trap.app) as trap_url:
        open_and_step(s, "redirect-1")
        r = http("POST", f"{s}/v1/sessions/redirect-1/migrate", KEY_A, {"target": trap_url, "timeout_s": 10})
        assert trap.requests == [], "the source sent something to a URL no operator listed"
        assert (r.status_code, code_of(r)) == (403, "target_not_allowed"), r.text
    assert serves(s, "redirect-1")


def test_a_lost_answer_never_leaves_two_copies_and_the_offer_cannot_be_replayed(cluster):
    s, t, b, p_url, proxy = cluster
    open_and_step(s, "clone-1")
    proxy.requests.clear()
    proxy.status_for["/v1/sessions/import"] = 500  # forwarded to T, T's answer lost on the way back
    try:
        r = http("POST", f"{s}/v1/sessions/clone-1/migrate", KEY_A, {"target": p_url, "timeout_s": 20})
    finally:
        proxy.status_for.clear()
    assert r.status_code != 200, r.text
    assert [serves(url, "clone-1") for url in (s, t)] == [True, False]  # exactly one copy serves
    offers = proxy.bodies("/v1/sessions/import")
    assert len(offers) == 1
    for url in (b, t):  # the captured offer, replayed: another engine, then its own target again
        r = http("POST", f"{url}/v1/sessions/import", None, content=offers[0],
                 headers={"content-type": "application/msgpack"})
        assert r.status_code in (403, 409), r.text
        assert code_of(r) in ("wrong_target", "replay"), r.text
        assert not serves(url, "clone-1")
    assert http("POST", f"{s}/v1/sessions/clone-1/step", KEY_A, {"input": [7]}).status_code == 200
    assert all("authorization" not in headers for _, _, headers, _ in proxy.requests), \
        "a server-to-server call carried an API key"
