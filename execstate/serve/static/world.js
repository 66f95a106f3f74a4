// The /world page: one world session over /v1/realtime/video (docs/world-serving.md).
// Chunks arrive as video.chunk_metadata + one binary frame (the chunk's PNGs back to back); frames
// are shown at the session's fps from a small queue. Keys are sent as key.down/key.up (the grid
// world: arrows or WASD move the agent; the maze: WASD walk and strafe, Q/E or the left/right
// arrows turn). In a world with a camera the mouse steers it: click the view for pointer lock (or
// drag in it); the movement since the last chunk is sent with each chunk as a camera velocity
// (vLLM-Omni's session.interaction, camera.v1) that turns the view by that much over the next chunk.
"use strict";
(() => {
  const params = new URLSearchParams(location.search);
  const $ = (id) => document.getElementById(id);
  const canvas = $("screen");
  const ctx2d = canvas.getContext("2d");
  const GRID_KEYS = { ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right",
                      w: "up", s: "down", a: "left", d: "right" };
  const MAZE_KEYS = { w: "forward", s: "back", a: "left", d: "right", q: "turn_left", e: "turn_right",
                      ArrowUp: "forward", ArrowDown: "back", ArrowLeft: "turn_left", ArrowRight: "turn_right" };
  const LOOK = 0.004;  // radians of camera per pixel of mouse movement
  let KEYMAP = GRID_KEYS, camera = null, world = params.get("world");
  if (params.get("prompt")) $("prompt").value = params.get("prompt");
  const look = { yaw: 0, pitch: 0, inFlight: null, drag: false };
  const stats = { frames: 0, chunks: 0, acked: 0, errors: [], behindMs: 0, shown: [], lastMeta: null,
                  ttfcMs: null, started: null, fps: 0, keysSent: [], done: null, chunkKeys: [], chunkHashes: [],
                  arrivals: [], skipped: 0, chunkCamera: [], cameraSent: [], world: null, atFrame: {}, chunkCompleted: [],
                  chunkStarted: [] };
  window.worldStats = stats;  // read by tests and curious users
  let ws = null, pendingMeta = null, queue = [], fps = Number(params.get("fps") || 16), paused = false;
  let nextShow = 0, held = new Set(), eventSeq = 0;

  function log(line) {
    const el = $("log");
    el.textContent += line + "\n";
    el.scrollTop = el.scrollHeight;
  }
  function send(msg) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(msg));
  }
  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v1/realtime/video";
    ws = window.execstateApiKey.socket(url, ["realtime"]);  // on a keyed server the key goes as a subprotocol
    ws.binaryType = "arraybuffer";
    ws.onopen = () => { $("status").textContent = "connected"; if (params.get("autostart") !== "0") start(); };
    ws.onclose = () => { $("status").textContent = "closed"; };
    ws.onmessage = (m) => (typeof m.data === "string" ? onEvent(JSON.parse(m.data)) : onChunk(m.data));
  }
  function start() {
    queue = []; nextShow = 0; held.clear(); serverHeld = null;
    stats.started = performance.now();
    const msg = { type: "session.create", event_id: "start-" + (++eventSeq), prompt: $("prompt").value,
                  seed: Number(params.get("seed") || 0), fps: fps, format: "png" };
    if (world) msg.model = world;
    send(msg);
  }
  function onEvent(ev) {
    switch (ev.type) {
      case "video.start":
        fps = ev.config.fps; $("target").textContent = fps === 0 ? "as fast as possible" : fps;
        $("status").textContent = "running " + ev.request_id; log("video.start " + ev.request_id);
        setWorld(ev.config); break;
      case "video.chunk_metadata": pendingMeta = ev; break;
      case "session.interaction.queued":
        stats.acked++; $("acked").textContent = stats.acked;
        if (ev.at_frame !== undefined) stats.atFrame[ev.event_id] = ev.at_frame;
        break;
      case "session.behind":
        stats.behindMs = ev.behind_ms; log("behind real time by " + ev.behind_ms.toFixed(0) + " ms"); break;
      case "session.closed": stats.done = ev; $("status").textContent = "done"; log("session.closed"); break;
      case "session.paused": $("status").textContent = "paused"; break;
      case "session.unpaused": $("status").textContent = "running"; break;
      case "error":
        stats.errors.push(ev); log("error " + ev.code + ": " + ev.message);
        if (ev.event_id === look.inFlight) look.inFlight = null;  // refused: nothing in flight
        break;
      default: log(ev.type);
    }
  }
  async function onChunk(buf) {
    const meta = pendingMeta; pendingMeta = null;
    if (!meta) return;
    stats.chunks++; stats.lastMeta = meta;
    stats.chunkKeys.push(meta.keys[0]); stats.chunkHashes.push(meta.frame_sha256);
    stats.chunkStarted.push(meta.started_event_ids);
    stats.chunkCompleted.push(meta.completed_event_ids);
    if (meta.camera) { stats.chunkCamera.push(meta.camera); flushLook(meta); }
    stats.arrivals.push(performance.now());
    if (stats.ttfcMs === null) {
      stats.ttfcMs = performance.now() - stats.started;
      $("ttfc").textContent = stats.ttfcMs.toFixed(0) + " ms";
    }
    $("chunk").textContent = meta.generation_chunk_index + " (" + meta.keys[0] + ")";
    $("stepms").textContent = meta.timings.step_ms.toFixed(1);
    $("active").textContent = meta.active_event_ids.join(", ") || "-";
    const behind = meta.behind_ms || 0;
    stats.behindMs = behind;
    const b = $("behind");
    b.textContent = behind > 0 ? "behind by " + behind.toFixed(0) + " ms" : "on time";
    b.className = behind > 1000 * meta.num_frames / Math.max(fps, 1e-9) ? "behind" : "ok";
    let pos = 0;
    for (const n of meta.frame_byte_lengths) {
      const bmp = await createImageBitmap(new Blob([buf.slice(pos, pos + n)], { type: "image/png" }));
      pos += n;
      queue.push(bmp);
    }
  }
  function draw(now) {
    const interval = fps > 0 ? 1000 / fps : 0;
    while (queue.length && now >= nextShow) {
      const bmp = queue.shift();
      if (queue.length > 8) { stats.skipped++; continue; }  // far behind: skip to stay live
      canvas.width = bmp.width; canvas.height = bmp.height;
      ctx2d.drawImage(bmp, 0, 0);
      stats.frames++; stats.shown.push(now);
      nextShow = Math.max(nextShow + interval, now - interval);
      if (interval) break;
    }
    while (stats.shown.length && stats.shown[0] < now - 1000) stats.shown.shift();
    stats.fps = stats.shown.length;
    $("fps").textContent = stats.fps;
    $("frames").textContent = stats.frames;
    requestAnimationFrame(draw);
  }
  // The server holds one key at a time (a key.down replaces the held key): send what changes
  // the held key; on a release, the newest key still pressed takes over.
  let serverHeld = null;
  function sendKey(key, down) {
    stats.keysSent.push([key, down]);
    send({ type: down ? "key.down" : "key.up", key: key, event_id: "k" + (++eventSeq) });
    serverHeld = down ? key : null;
  }
  function keyEvent(e, down) {
    const key = KEYMAP[e.key.length === 1 ? e.key.toLowerCase() : e.key];
    if (!key || document.activeElement === $("prompt")) return;
    e.preventDefault();
    if (down === held.has(key)) return;  // auto-repeat, or a release of a key pressed elsewhere
    if (down) { held.delete(key); held.add(key); } else { held.delete(key); }
    const span = document.querySelector('#keys span[data-key="' + key + '"]');
    if (span) span.className = down ? "down" : "";
    if (down) sendKey(key, true);
    else if (serverHeld === key) {
      const rest = [...held];
      rest.length ? sendKey(rest[rest.length - 1], true) : sendKey(key, false);
    }
  }
  // The world of the session: its keys and, with a camera, the mouse.
  function setWorld(config) {
    camera = config.camera || null; stats.world = config.world;
    KEYMAP = camera ? MAZE_KEYS : GRID_KEYS;
    const names = { up: "\u2191", down: "\u2193", left: camera ? "A" : "\u2190", right: camera ? "D" : "\u2192",
                    forward: "W", back: "S", turn_left: "Q", turn_right: "E" };
    $("keys").innerHTML = config.keys.map((k) => '<span data-key="' + k + '">' + (names[k] || k) + "</span>").join("");
    $("help").textContent = camera ? "(WASD walk and strafe, Q/E or arrows turn; click the view or drag in it "
                                     + "to look around)" : "(arrow keys or WASD move the agent)";
    const sel = $("world");
    if (config.worlds && sel.options.length !== config.worlds.length) {
      sel.innerHTML = config.worlds.map((w) => "<option>" + w + "</option>").join("");
    }
    sel.value = config.model;
  }
  // Mouse movement: turn the view by exactly what the mouse moved. One camera event in flight at a
  // time, a target relative to the pose it starts from ("turn by"), over one chunk; movement that
  // comes while one is in flight is sent when the chunk that completes it arrives.
  function onLook(dx, dy) {
    if (!camera) return;
    look.yaw += dx * LOOK; look.pitch -= dy * LOOK;
  }
  function flushLook(meta) {
    if (look.inFlight && !meta.completed_event_ids.includes(look.inFlight)) return;
    look.inFlight = null;
    if (look.yaw === 0 && look.pitch === 0) return;
    const id = "c" + (++eventSeq);
    stats.cameraSent.push([id, look.yaw, look.pitch]);
    send({ type: "session.interaction", event_id: id, interaction: { transition_chunks: 1, event: {
      multi_modal_data: { camera: { schema: "camera.v1", mode: "target",
                                    data: { yaw: look.yaw, pitch: look.pitch, relative: true } } } } } });
    look.inFlight = id; look.yaw = 0; look.pitch = 0;
  }
  canvas.addEventListener("click", () => { if (camera && canvas.requestPointerLock) canvas.requestPointerLock(); });
  canvas.addEventListener("mousedown", () => { look.drag = true; });
  document.addEventListener("mouseup", () => { look.drag = false; });
  document.addEventListener("mousemove", (e) => {
    if (document.pointerLockElement === canvas || look.drag) onLook(e.movementX, e.movementY);
  });
  $("world").onchange = () => { world = $("world").value; send({ type: "session.close" }); setTimeout(start, 200); };
  document.addEventListener("keydown", (e) => keyEvent(e, true));
  document.addEventListener("keyup", (e) => keyEvent(e, false));
  $("send-prompt").onclick = () => send({ type: "session.interaction", event_id: "p" + (++eventSeq),
                                          interaction: { event: { prompt: $("prompt").value } } });
  $("start").onclick = () => start();
  $("stop").onclick = () => send({ type: "session.close" });
  $("pause").onclick = () => {
    paused = !paused;
    send({ type: paused ? "session.pause" : "session.unpause" });
    $("pause").textContent = paused ? "resume" : "pause";
  };
  requestAnimationFrame(draw);
  connect();
})();
