"""The /world page in a real browser: headless Chromium (Debian's package) driven by playwright
opens the page, which starts a session; frames arrive and are drawn; arrow keys are sent as held
keys, acknowledged, and show up in the chunks' keys; with the trained world model the agent moves
the way the keys say. Saves a screenshot (``WORLD_SCREENSHOT=path`` also copies it there;
``WORLD_MODEL_DIR=dir`` runs a trained model from that directory).

Skipped only where Chromium or playwright is missing *and* not in CI (CI installs both; there
a missing browser fails the test)."""

from __future__ import annotations

import base64
import io
import os
import shutil
import time

import numpy as np
import pytest
from PIL import Image
from world_serve_helpers import tiny_world_model, world_server

from execstate.model.world import renderer
from execstate.serve.world_driver import WorldHost

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _need_browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if CHROMIUM is None or sync_playwright is None:
        missing = "chromium (apt-get install chromium)" if CHROMIUM is None else "playwright (pip install playwright)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must install {missing} for the browser test")
        pytest.skip(f"{missing} is not installed")
    return sync_playwright


def world_model_for_browser():
    """The trained default world model when it is prepared on this machine (the movement check
    needs a model that follows the keys), else the tiny random one."""
    from execstate.model.world.default import load_default_world_model
    from execstate.model.world.model import ChunkedWorldModel

    if os.environ.get("WORLD_MODEL_DIR"):  # a trained model elsewhere (e.g. a new training run)
        return ChunkedWorldModel.load(os.environ["WORLD_MODEL_DIR"]), True
    try:
        return load_default_world_model(), True
    except FileNotFoundError:  # neither prepared nor shipped (yet)
        return tiny_world_model(), False


def canvas_frame(page) -> np.ndarray:
    url = page.evaluate("document.getElementById('screen').toDataURL('image/png')")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))


def wait_for(page, expr: str, timeout_s: float = 60.0) -> None:
    page.wait_for_function(expr, timeout=timeout_s * 1000)


def test_world_page_in_chromium(tmp_path):
    sync_playwright = _need_browser()
    model, trained = world_model_for_browser()
    host = WorldHost(model, default_fps=16)
    try:
        with world_server(host) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 900, "height": 520})
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{url}/world?fps=16&seed=3")
                wait_for(page, "window.worldStats && window.worldStats.frames >= 8")
                before = canvas_frame(page)
                start_pos = renderer.locate_agent(before)
                page.keyboard.down("ArrowRight")
                wait_for(page, "window.worldStats.chunkKeys.slice(-3).every(k => k === 'right')")
                page.keyboard.down("ArrowUp")  # a second key takes over while pressed...
                wait_for(page, "window.worldStats.chunkKeys.slice(-2).every(k => k === 'up')")
                page.keyboard.up("ArrowUp")  # ...and on its release the key still pressed resumes
                wait_for(page, "window.worldStats.chunkKeys.slice(-2).every(k => k === 'right')")
                page.keyboard.up("ArrowRight")
                page.keyboard.down("s")  # WASD too: s = down
                wait_for(page, "window.worldStats.chunkKeys.slice(-2).every(k => k === 'down')")
                shot = tmp_path / "world_page.png"
                page.screenshot(path=str(shot))  # live: frames flowing, keys acknowledged
                page.keyboard.up("s")
                wait_for(page, "window.worldStats.acked >= 6 && window.worldStats.chunkKeys.slice(-1)[0] === 'none'")
                page.click("#pause")
                wait_for(page, "document.getElementById('status').textContent === 'paused'")
                time.sleep(1.0)  # the step in progress at the pause is still delivered
                wait_for(page, "worldStats.frames + worldStats.skipped === worldStats.chunks * 2")
                stats = page.evaluate("({frames: worldStats.frames, chunks: worldStats.chunks, acked: worldStats.acked,"
                                      " errors: worldStats.errors, keys: worldStats.chunkKeys, fps: worldStats.fps,"
                                      " ttfc: worldStats.ttfcMs, arrivals: worldStats.arrivals})")
                after = canvas_frame(page)  # the last frame of the last chunk
            finally:
                browser.close()
    finally:
        host.shutdown()
    assert not errors, errors
    assert stats["errors"] == [], stats["errors"]
    assert stats["acked"] >= 6  # right, up, right again, release, s, release: all acknowledged
    assert stats["frames"] >= 8 and stats["chunks"] >= 6
    keys = stats["keys"]
    assert keys[0] == "none" and "right" in keys and "down" in keys
    runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]  # the keys in the order they acted
    assert runs[-5:] == ["right", "up", "right", "down", "none"] or runs[-6:-1] == ["right", "up", "right", "none",
                                                                                       "down"], runs
    assert before.shape == after.shape == model.spec.frame_shape
    if os.environ.get("WORLD_SCREENSHOT"):
        shutil.copy(shot, os.environ["WORLD_SCREENSHOT"])
    if trained:  # the agent moves the way the keys say: where the renderer puts it for the same keys
        f = model.spec.frames_per_chunk
        frame_keys = np.repeat([renderer.ACTIONS.index(k) for k in keys], f)
        states, _ = renderer.trajectory(renderer.initial_state(3, renderer.theme_for_prompt("a meadow maze")),
                                        frame_keys)
        truth_start, truth_end = renderer.agent_center(states[0]), renderer.agent_center(states[-1])
        end_pos = renderer.locate_agent(after)
        assert start_pos is not None and end_pos is not None
        assert truth_end != truth_start  # the keys moved the agent in the ground truth
        assert max(abs(end_pos[0] - truth_end[0]), abs(end_pos[1] - truth_end[1])) <= 2.0, (end_pos, truth_end)
