// The /agent page: talk to the voice agent over /v1/voice/realtime (OpenAI Realtime audio events).
// Microphone: getUserMedia (echo cancellation on) -> AudioWorklet (16 kHz PCM16) -> append.
// Playback: each audio delta is scheduled on a 24 kHz AudioContext as it arrives; the words of a
// reply appear when playback reaches them; a hold suspends playback, a resume continues it, an
// interruption stops it and reports the played position (conversation.item.truncate), and the
// reply's text is cut there. Delegations are listed as they run and settle. A typed message is a
// user item (conversation.item.create) answered at once (response.create). Turns end by the front
// model's end-of-turn score (semantic_vad). Errors are listed under the bar. window.agentState
// exposes what the page did (for tests).
(() => {
  const $ = (id) => document.getElementById(id);
  const state = window.agentState = {
    events: [], sessionId: null, micOn: false, echoCancellation: null, playing: false,
    responses: {}, truncations: [], delegations: {}, userItems: {}, sentSamples: 0, errors: [],
  };
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = window.execstateApiKey.socket(`${proto}//${location.host}/v1/voice/realtime`, ["realtime"]);  // /api-key.js
  const OUT_RATE = 24000;
  let player = null;  // the playback AudioContext
  let nextTime = 0;  // where the next audio chunk starts (player time)
  let current = null;  // the response whose audio plays

  const send = (msg) => ws.readyState === 1 && ws.send(JSON.stringify(msg));
  const status = (t) => { $("status").textContent = t; };
  function showError(text) {
    state.errors.push(text);
    const div = document.createElement("div");
    div.textContent = text;
    $("errors").appendChild(div);
  }

  function b64ToInt16(b64) {
    const bin = atob(b64), out = new Int16Array(bin.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) << 16 >> 16;
    return out;
  }
  function int16ToB64(buf) {
    const bytes = new Uint8Array(buf);
    let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(s);
  }
  function line(cls, text) {
    const div = document.createElement("div");
    div.className = `line ${cls}`;
    div.textContent = text;
    $("transcript").appendChild(div);
    return div;
  }

  // -- playback ----------------------------------------------------------------------------------
  function ensurePlayer() {
    if (!player) player = new AudioContext({ sampleRate: OUT_RATE });
    if (player.state === "suspended" && !(current && current.held)) player.resume();
  }
  function playedSamples(r) {  // of response r, at the player's clock
    if (!r || r.startTime === null) return 0;
    return Math.max(0, Math.min(r.samples, Math.round((player.currentTime - r.startTime) * OUT_RATE)));
  }
  function onAudio(ev) {
    ensurePlayer();
    const r = state.responses[ev.response_id];
    if (!r || r.stopped) return;
    const pcm = b64ToInt16(ev.delta);
    const buf = player.createBuffer(1, pcm.length, OUT_RATE);
    const ch = buf.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
    const src = player.createBufferSource();
    src.buffer = buf;
    src.connect(player.destination);
    const at = Math.max(player.currentTime + 0.02, nextTime);
    if (r.startTime === null) r.startTime = at;
    else if (at > r.startTime + r.samples / OUT_RATE + 1e-3) r.startTime = at - r.samples / OUT_RATE;  // an underrun
    src.start(at);
    nextTime = at + pcm.length / OUT_RATE;
    r.sources.push(src);
    r.samples += pcm.length;
    state.playing = true;
    current = r;
  }
  function stopPlayback(reason) {  // an interruption: stop everything, report the played position
    const r = current;
    if (!r || r.stopped) return;
    const played = playedSamples(r);
    r.stopped = true;
    for (const s of r.sources) { try { s.stop(); } catch (e) { /* not started */ } }
    r.sources = [];
    nextTime = 0;
    state.playing = false;
    const ms = Math.floor((played * 1000) / OUT_RATE);
    r.playedMs = ms;
    r.cut = true;
    renderReply(r, played);
    send({ type: "conversation.item.truncate", item_id: r.id, content_index: 0, audio_end_ms: ms });
    state.truncations.push({ item_id: r.id, audio_end_ms: ms, reason, text: r.shown });
    if (player.state === "suspended") player.resume();
  }
  function renderReply(r, played) {
    const words = r.words.filter((w) => w.offset < played || (!r.cut && r.done && played >= r.samples));
    r.shown = words.map((w) => w.text).join("");
    r.div.textContent = r.shown.trim() || "…";
    r.div.classList.toggle("cut", !!r.cut);
  }
  function tick() {
    if (current && !current.stopped && player) {
      const played = playedSamples(current);
      renderReply(current, played);
      if (current.done && played >= current.samples) { state.playing = false; }
    }
    requestAnimationFrame(tick);
  }
  requestAnimationFrame(tick);

  // -- events ------------------------------------------------------------------------------------
  const handlers = {
    "session.created": (ev) => {
      state.sessionId = ev.session.id;
      status("connected");
      send({ type: "session.update", session: { type: "realtime", audio: {
        input: { format: { type: "audio/pcm", rate: 16000 }, turn_detection: { type: "semantic_vad", eagerness: "auto" } },
        output: { format: { type: "audio/pcm", rate: OUT_RATE } } } } });
    },
    "input_audio_buffer.speech_started": (ev) => {
      state.userItems[ev.item_id] = line("user partial", "…");
      if (current && !current.stopped && state.playing) stopPlayback("speech_started");
    },
    "conversation.item.input_audio_transcription.delta": (ev) => {
      const d = state.userItems[ev.item_id];
      if (d) d.textContent = ev.partial || d.textContent;
    },
    "conversation.item.input_audio_transcription.completed": (ev) => {
      const d = state.userItems[ev.item_id] || line("user", "");
      d.textContent = ev.transcript || "(nothing heard)";
      d.className = "line user";
    },
    "input.turn": (ev) => {
      if (ev.kind === "hold" && player && current && !current.stopped) { current.held = true; player.suspend(); }
      if (ev.kind === "resume" && player) { if (current) current.held = false; player.resume(); }
    },
    "response.created": (ev) => {
      const id = ev.response.id;
      state.responses[id] = { id, div: line("agent", "…"), words: [], sources: [], samples: 0, startTime: null,
        stopped: false, done: false, cut: false, shown: "", held: false };
    },
    "response.output_audio.delta": onAudio,
    "response.output_audio_transcript.delta": (ev) => {
      const r = state.responses[ev.response_id];
      if (r) r.words.push({ text: ev.delta, offset: ev.audio_offset || 0 });
    },
    "response.done": (ev) => {
      const r = state.responses[ev.response.id];
      if (!r) return;
      r.done = true;
      r.status = ev.response.status;
      if (ev.response.status === "cancelled" && !r.stopped && current === r) stopPlayback("cancelled");
    },
    "delegation.created": (ev) => {
      const div = document.createElement("div");
      div.className = "dlg open";
      div.textContent = `${ev.tool}(${Object.values(ev.arguments).join(", ")}) … running`;
      $("delegations").appendChild(div);
      state.delegations[ev.delegation_id] = { tool: ev.tool, arguments: ev.arguments, status: "open", div };
    },
    "delegation.result": (ev) => {
      const d = state.delegations[ev.delegation_id];
      if (!d) return;
      d.status = ev.status; d.result = ev.result;
      d.div.className = `dlg ${ev.status}`;
      d.div.textContent = `${d.tool}(${Object.values(d.arguments).join(", ")}) → ${ev.result || ev.error} (${ev.status})`;
    },
    "conversation.item.added": (ev) => {
      const part = (ev.item.content || [])[0];
      if (part && part.type === "input_text" && !state.userItems[ev.item.id]) state.userItems[ev.item.id] = line("user", part.text);
    },
    "error": (ev) => { status(`error: ${ev.error.code}`); showError(`${ev.error.code}: ${ev.error.message}`); },
  };
  ws.onmessage = (m) => {
    const ev = JSON.parse(m.data);
    state.events.push(ev.type === "response.output_audio.delta" ? { type: ev.type, response_id: ev.response_id } : ev);
    (handlers[ev.type] || (() => {}))(ev);
  };
  ws.onclose = (e) => { status("disconnected"); if (e.code !== 1000) showError(`connection closed (${e.code}) ${e.reason || ""}`); };
  ws.onerror = () => showError("the connection to the server failed");

  // -- typed messages ----------------------------------------------------------------------------
  $("text-form").onsubmit = (e) => {
    e.preventDefault();
    const text = $("text").value.trim();
    if (!text) return;
    ensurePlayer();
    if (current && !current.stopped && state.playing) stopPlayback("typed");
    send({ type: "conversation.item.create", item: { type: "message", role: "user",
      content: [{ type: "input_text", text }] } });
    send({ type: "response.create" });
    $("text").value = "";
  };

  // -- microphone --------------------------------------------------------------------------------
  let mic = null;
  $("mic").onclick = async () => {
    ensurePlayer();
    if (mic) {
      mic.stream.getTracks().forEach((t) => t.stop());
      await mic.ctx.close();
      mic = null; state.micOn = false; $("mic").classList.remove("on"); $("mic-label").textContent = "Talk";
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: {
        echoCancellation: true, noiseSuppression: true, autoGainControl: false, channelCount: 1 } });
    } catch (err) {
      showError(`microphone unavailable: ${err.message || err.name} (you can type instead)`);
      return;
    }
    state.echoCancellation = stream.getAudioTracks()[0].getSettings().echoCancellation;
    const ctx = new AudioContext();
    await ctx.audioWorklet.addModule("/agent-worklet.js");
    const node = new AudioWorkletNode(ctx, "pcm16-capture");
    node.port.onmessage = (m) => {
      state.sentSamples += m.data.byteLength / 2;
      send({ type: "input_audio_buffer.append", audio: int16ToB64(m.data) });
    };
    ctx.createMediaStreamSource(stream).connect(node);
    mic = { stream, ctx, node };
    state.micOn = true; state.inputRate = ctx.sampleRate;
    $("mic").classList.add("on"); $("mic-label").textContent = "Stop";
  };
})();
