"""The /world page with the first-person maze in headless Chromium: the world is chosen by the page's
URL, WASD walk, and a scripted mouse drag over the view turns the camera: the page sends the drag as
camera targets relative to the current pose (vLLM-Omni's session.interaction), the chunks report the
turned poses, and the
frames show it (with the trained model: the view after the turn is the view before it shifted by the
angle turned). The page's frames equal the offline session's for the same events, bit for bit."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from test_world_browser import CHROMIUM, _need_browser, canvas_frame, wait_for
from world_serve_helpers import world_server

from execstate.model.world.maze.model import MazeWorldModel
from execstate.model.world.maze.pose import DTHETA
from execstate.serve.realtime.world.encode import frame_sha256
from execstate.serve.realtime.world.host import WorldHost
from execstate.serve.realtime.world.hosts import WorldHosts
from execstate.session.world.offline import World, scene_frames
from tests.model.world.maze.maze_helpers import random_maze_net

PROMPT = "an ice maze"


def maze_model_for_browser() -> tuple[MazeWorldModel, bool]:
    """The shipped maze model (the frames-show-the-turn check needs a trained model), else a tiny random one."""
    from execstate.model.world_default import load_default_maze_model

    try:
        return load_default_maze_model(), True
    except FileNotFoundError:
        return MazeWorldModel(random_maze_net(), "tiny-maze-random"), False


def best_shift(after: np.ndarray, before: np.ndarray, most: int = 40) -> int:
    """The column shift ``s`` that best explains ``after[:, c] == before[:, c + s]`` (a turn right: ``s > 0``)."""
    w = before.shape[1]
    errs = {s: np.mean((after[:, max(0, -s) : w - max(0, s)].astype(float)
                        - before[:, max(0, s) : w + min(0, s)].astype(float)) ** 2) for s in range(-most, most + 1)}
    return min(errs, key=errs.get)


def test_maze_page_turns_with_a_drag(tmp_path):
    sync_playwright = _need_browser()
    model, trained = maze_model_for_browser()
    hosts = WorldHosts([WorldHost(model, model_name="maze", default_fps=16)])
    try:
        with world_server(hosts) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 900, "height": 560})
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{url}/world?fps=16&seed=3&world=maze&prompt=" + PROMPT.replace(" ", "%20"))
                wait_for(page, "window.worldStats && window.worldStats.world === 'maze' && worldStats.frames >= 6")
                box = page.locator("#screen").bounding_box()
                x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
                page.mouse.move(x - 100, y)
                page.mouse.down()
                page.mouse.move(x + 100, y, steps=12)  # drag 200 px right: look right
                page.mouse.up()
                # every pixel of the drag sent, and the last camera event completed
                wait_for(page, "worldStats.cameraSent.reduce((a, c) => a + c[1], 0) > 0.7999 && "
                               "worldStats.chunkCompleted.flat().includes("
                               "worldStats.cameraSent[worldStats.cameraSent.length - 1][0])")
                page.keyboard.down("w")
                wait_for(page, "worldStats.chunkKeys.slice(-2).every(k => k === 'forward')")
                page.keyboard.up("w")
                wait_for(page, "worldStats.chunkKeys.slice(-1)[0] === 'none'")
                shot = tmp_path / "world_maze_page.png"
                page.screenshot(path=str(shot))
                page.evaluate("document.exitPointerLock(); document.getElementById('pause').click()")
                wait_for(page, "document.getElementById('status').textContent === 'paused'")
                wait_for(page, "worldStats.frames + worldStats.skipped === worldStats.chunks * 2")
                stats = page.evaluate("({keys: worldStats.chunkKeys, hashes: worldStats.chunkHashes, "
                                      "camera: worldStats.chunkCamera, sent: worldStats.cameraSent, "
                                      "started: worldStats.chunkStarted, at: worldStats.atFrame, "
                                      "errors: worldStats.errors})")
                canvas_frame(page)
            finally:
                browser.close()
    finally:
        hosts.shutdown()
    assert not errors and stats["errors"] == [], (errors, stats["errors"])
    if os.environ.get("WORLD_MAZE_SCREENSHOT"):
        shutil.copy(shot, os.environ["WORLD_MAZE_SCREENSHOT"])
    yaws = [f["yaw"] for c in stats["camera"] for f in c]
    turned = yaws[-1] - yaws[0]
    assert turned == pytest.approx(200 * 0.004, rel=0.02)  # every pixel of the drag turned the view
    assert "forward" in stats["keys"]
    # the offline session fed the same events at the same boundaries gives the same frames
    sent = {i: (vy, vp) for i, vy, vp in stats["sent"]}
    frames = replay(model, stats["keys"], stats["started"], sent, stats["at"])
    assert [h for hs in stats["hashes"] for h in hs] == [frame_sha256(f) for f in frames]
    if trained:  # the frames show the turn: the view after it is the view before it, shifted
        first = next(i for i, s in enumerate(stats["started"]) if any(e.startswith("c") for e in s))
        last = max(i for i, s in enumerate(stats["started"]) if any(e.startswith("c") for e in s))
        before, after = frames[2 * first - 1], frames[2 * last + 1]
        cols = (yaws[2 * last + 1] - yaws[2 * first - 1]) / DTHETA
        assert abs(best_shift(after, before) - cols) <= max(3, 0.15 * abs(cols)), (best_shift(after, before), cols)


def replay(model, keys, started, sent, at) -> list[np.ndarray]:  # noqa: ANN001
    world = World(model, max_sessions=1)
    try:
        s = world.open_session(prompt=PROMPT, seed=3, scene_seed=3)
        out = list(scene_frames(model.spec, 3, PROMPT))
        for i in range(1, len(keys)):
            for e in started[i]:
                if e in sent:
                    vy, vp = sent[e]
                    s.submit_event(s.next_event_id(), "camera", {"mode": "target", "yaw": vy, "pitch": vp,
                                                                 "relative": True, "transition_chunks": 1,
                                                                 "at_frame": at.get(e, 0)})
            out.extend(s.step(action=keys[i]).frames)
    finally:
        world.close()
    return out


