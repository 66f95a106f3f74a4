// The API key of a keyed server, for the browser pages (/world, /agent): served at /api-key.js.
// A browser cannot set headers on a WebSocket, so the key is offered as the subprotocol
// "openai-insecure-api-key.<key>" (as OpenAI's Realtime API accepts it). It comes from ?key= (then
// removed from the address bar) or this tab's sessionStorage; when the server refuses a socket and
// GET /v1/models answers 401 (a missing or wrong key, not a server that is down), the page asks for
// the key and reloads. window.execstateApiKey.socket(url, protocols) opens a page's WebSocket.
"use strict";
(() => {
  const STORE = "execstate-api-key";
  const PREFIX = "openai-insecure-api-key.";
  const params = new URLSearchParams(location.search);
  if (params.get("key")) {
    sessionStorage.setItem(STORE, params.get("key"));
    params.delete("key");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  const key = () => sessionStorage.getItem(STORE);
  async function refused() {
    const headers = key() ? { Authorization: "Bearer " + key() } : {};
    let status = 0;
    try { status = (await fetch("/v1/models", { headers })).status; } catch (e) { return; }
    if (status !== 401) return;
    const given = window.prompt(key() ? "The API key was refused. API key:" : "This server asks for an API key:");
    if (given && given.trim()) {
      sessionStorage.setItem(STORE, given.trim());
      location.reload();
    }
  }
  window.execstateApiKey = {
    protocols(base) { return key() ? [...base, PREFIX + key()] : base; },
    socket(url, base) {
      const ws = new WebSocket(url, this.protocols(base || []));
      let opened = false;
      ws.addEventListener("open", () => { opened = true; });
      ws.addEventListener("close", () => { if (!opened) refused(); });
      return ws;
    },
  };
})();
