"""The /world page in a real browser: headless Chromium (Debian's package) driven by playwright
opens the page, which starts a session; frames arrive and are drawn; arrow keys and WASD are sent
as held keys, acknowledged, and show up in the chunks' keys in the order pressed. The page's frames
equal the offline session's for the same keys, bit for bit, and the canvas shows the last one;
with the trained world model, in each run of a held key the agent moves the way the renderer moves
it. Saves a screenshot (``WORLD_SCREENSHOT=path`` copies it there; ``WORLD_MODEL_DIR=dir`` runs a
trained model from that directory).

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
from execstate.serve.realtime.world.encode import frame_sha256
from execstate.serve.realtime.world.host import WorldHost
from execstate.session.world.offline import World, scene_frames

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
    from execstate.model.world.model import ChunkedWorldModel
    from execstate.model.world_default import load_default_world_model

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
                                      " ttfc: worldStats.ttfcMs, hashes: worldStats.chunkHashes})")
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
    # The page got exactly the offline session's frames for these keys (frame hashes), and showed
    # the last one (the canvas, read back).
    frames = offline_frames(model, 3, "a meadow maze", keys)
    assert [h for hs in stats["hashes"] for h in hs] == [frame_sha256(fr) for fr in frames]
    assert np.abs(after.astype(int) - frames[-1].astype(int)).max() <= 2
    if trained:
        check_follows_keys(model, keys, frames)


def offline_frames(model, seed: int, prompt: str, chunk_keys: list[str]) -> list[np.ndarray]:
    """The offline World session for the chunks' keys (chunk 0: the scene)."""
    world = World(model, numerics=model.spec.numerics, max_sessions=1)
    try:
        s = world.open_session(prompt=prompt, seed=seed, scene_seed=seed)
        out = list(scene_frames(model.spec, seed, prompt))
        for k in chunk_keys[1:]:
            out.extend(s.step(action=k).frames)
    finally:
        world.close()
    return out


def check_follows_keys(model, keys: list[str], frames: list[np.ndarray]) -> None:
    """The agent moves the way the keys say: over each run of chunks with one key held, where the
    renderer (same start, same keys) moves the agent that way, the generated agent moves that way too."""
    f = model.spec.frames_per_chunk
    states, _ = renderer.trajectory(renderer.initial_state(3, renderer.theme_for_prompt("a meadow maze")),
                                    np.repeat([renderer.ACTIONS.index(k) for k in keys], f))
    axis = {"up": (0, -1), "down": (0, 1), "left": (1, -1), "right": (1, 1)}
    checked = 0
    i = 1
    while i < len(keys):
        j = i
        while j < len(keys) and keys[j] == keys[i]:
            j += 1
        if keys[i] in axis:
            a, sign = axis[keys[i]]
            first, last = i * f - 1, j * f - 1  # the frame before the run, the run's last frame
            moved = sign * (renderer.agent_center(states[last])[a] - renderer.agent_center(states[first])[a])
            p0, p1 = renderer.locate_agent(frames[first]), renderer.locate_agent(frames[last])
            if moved > 0 and p0 is not None and p1 is not None:
                assert sign * (p1[a] - p0[a]) > 0, (keys[i], p0, p1)
                checked += 1
        i = j
    assert checked >= 1, "no run of a held key in which the renderer moved the agent"
