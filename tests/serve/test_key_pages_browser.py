"""The browser pages on a keyed server, in headless Chromium: ``/world`` opens its WebSocket without
a key, the server refuses it, the page sees ``GET /v1/models`` answer 401 and asks for the key (a
prompt), keeps it in the tab and reloads; the socket then opens with the key as its subprotocol and
frames arrive. The page itself names no model. ``?key=`` works too and leaves the address bar.
Skipped only where Chromium or playwright is missing and not in CI (as tests/serve/test_world_browser.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from serve_helpers import running_server
from test_world_browser import CHROMIUM, _need_browser, wait_for
from world_serve_helpers import tiny_world_model

from execstate.serve.landing import install_landing
from execstate.serve.principals import KeyRing
from execstate.serve.realtime.world.app import build_world_app
from execstate.serve.realtime.world.host import WorldHost

KEY = "sk-browser-page-0001"


@contextlib.contextmanager
def keyed_world_server(host: WorldHost) -> Iterator[str]:
    app = build_world_app(host, keys=KeyRing.build([KEY]))
    install_landing(app)
    with running_server(app) as (url, _):
        yield url


def test_the_world_page_asks_for_the_key_and_offers_it():
    sync_playwright = _need_browser()
    host = WorldHost(tiny_world_model(), model_name="tiny-world", default_fps=16)
    asked: list[str] = []
    try:
        with keyed_world_server(host) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page()

                def answer(dialog) -> None:
                    asked.append(dialog.message)
                    dialog.accept(KEY)

                page.on("dialog", answer)
                page.goto(f"{url}/world?fps=16&seed=1")
                html = httpx.get(f"{url}/world", timeout=30).text  # what a keyless browser gets
                wait_for(page, "window.worldStats && window.worldStats.frames >= 4")
                stored = page.evaluate("sessionStorage.getItem('execstate-api-key')")
                landing = page.goto(f"{url}/").text()
                second = browser.new_page()  # ?key=: no prompt, and the key leaves the address bar
                second.goto(f"{url}/world?fps=16&seed=2&key={KEY}")
                wait_for(second, "window.worldStats && window.worldStats.frames >= 4")
                address = second.url
            finally:
                browser.close()
    finally:
        host.shutdown()
    assert "tiny-world" not in html and '<script src="/api-key.js">' in html
    assert asked == ["This server asks for an API key:"], asked
    assert stored == KEY
    assert "tiny-world" not in landing and "API key" in landing
    assert "key=" not in address and "seed=2" in address
