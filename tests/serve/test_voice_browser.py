"""The /agent page in headless Chromium with a fake microphone (a WAV file of synthesised speech):
the spoken question is recognised, delegated, and the page plays an answer containing 391; a long
reply interrupted by speech stops playing, the page reports where (truncate) and its transcript is
cut there. Echo cancellation is on. Skipped only where Chromium or playwright is missing and not
in CI (CI installs both)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from voice_serve_helpers import speech, voice_server

from execstate.voice.pcm import write_wav

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RATE = 44100


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


def mic_file(path, parts: list[tuple[float, str]], total_s: float) -> None:
    """A WAV at 44.1 kHz: each text spoken at its second, silence elsewhere."""
    x = np.zeros(int(total_s * RATE), np.int16)
    for at, text in parts:
        s = speech(text, RATE)
        i = int(at * RATE)
        x[i:i + len(s)] = s[:len(x) - i]
    write_wav(path, x, RATE)


def open_page(pw, url: str, wav):
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}%noloop",
        "--autoplay-policy=no-user-gesture-required"])
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/agent")
    page.wait_for_function("window.agentState && window.agentState.sessionId", timeout=30_000)
    page.wait_for_function("window.agentState.events.some(e => e.type === 'session.updated')", timeout=30_000)
    page.click("#mic")
    page.wait_for_function("window.agentState.micOn", timeout=30_000)
    return browser, page, errors


def test_page_asks_17_times_23_and_plays_391(served, tmp_path):
    sync_playwright = _need_browser()
    wav = tmp_path / "question.wav"
    mic_file(wav, [(0.8, "what is seventeen times twenty three")], 20.0)
    with voice_server(served) as url, sync_playwright() as pw:
        browser, page, errors = open_page(pw, url, wav)
        try:
            page.wait_for_function("""
                Object.values(window.agentState.delegations).some(d => d.status === 'completed')
                && Object.values(window.agentState.responses).some(r => r.shown.includes('391'))""",
                                   timeout=60_000)
            st = page.evaluate("""() => { const s = window.agentState; return {
                ec: s.echoCancellation, rate: s.inputRate, sent: s.sentSamples,
                dlg: Object.values(s.delegations).map(d => [d.tool, d.arguments, d.status, d.result]),
                user: s.events.filter(e => e.type === 'conversation.item.input_audio_transcription.completed')
                              .map(e => e.transcript),
                replies: Object.values(s.responses).map(r => [r.shown, r.samples, r.cut]),
                html: document.getElementById('delegations').textContent,
                lines: [...document.querySelectorAll('.line')].map(d => d.textContent)}; }""")
            page.screenshot(path=str(tmp_path / "agent.png"))
            if os.environ.get("AGENT_SCREENSHOT"):
                shutil.copy(tmp_path / "agent.png", os.environ["AGENT_SCREENSHOT"])
        finally:
            browser.close()
    assert not errors, errors
    assert st["ec"] is True and st["rate"] in (44100, 48000) and st["sent"] > 16000
    assert st["user"][0] == "what is 17 times 23"
    assert st["dlg"] == [["calculator", {"expression": "17 times 23"}, "completed", "391"]]
    assert "calculator(17 times 23) → 391 (completed)" in st["html"]
    answer = next(r for r in st["replies"] if "391" in r[0])
    assert answer[0].startswith(" The answer is 391") and answer[1] > 24000 and not answer[2]
    assert "what is 17 times 23" in st["lines"] and any(line.startswith("The answer is 391") for line in st["lines"])


def test_page_interrupted_reply_stops_and_is_cut(served, tmp_path):
    sync_playwright = _need_browser()
    wav = tmp_path / "interrupt.wav"
    # the interruption comes 3 s after the question's end: its turn ends after semantic_vad's long
    # silence (1 s: a random front scores no end), and the reply must be playing by then, even under load
    mic_file(wav, [(0.8, "tell me a long story about the sea"),
                   (6.4, "wait stop tell me about the moon instead")], 15.0)
    with voice_server(served) as url, sync_playwright() as pw:
        browser, page, errors = open_page(pw, url, wav)
        try:
            page.wait_for_function("""window.agentState.truncations.length > 0 && window.agentState.events.filter(
                e => e.type === 'input.turn' && e.kind === 'end_of_turn').length >= 2""", timeout=60_000)
            st = page.evaluate("""() => { const s = window.agentState; const t = s.truncations[0];
                const r = s.responses[t.item_id]; return {
                t, shown: r.shown, cut: r.cut, samples: r.samples, stopped: r.stopped, sources: r.sources.length,
                div: r.div.textContent, cls: r.div.className,
                done: s.events.filter(e => e.type === 'response.done' && e.response.id === t.item_id)
                             .map(e => [e.response.status, e.response.output[0].content[0].transcript]),
                truncated: s.events.filter(e => e.type === 'conversation.item.truncated')
                                   .map(e => [e.item_id, e.audio_end_ms, e.transcript]),
                after: s.events.findIndex(e => e.type === 'response.done' && e.response.id === t.item_id),
                audioAfter: s.events.filter((e, i) => e.type === 'response.output_audio.delta'
                             && e.response_id === t.item_id
                             && i > s.events.findIndex(x => x.type === 'input.turn' && x.kind === 'hold')).length,
                users: s.events.filter(e => e.type === 'conversation.item.input_audio_transcription.completed')
                               .map(e => e.transcript)}; }""")
        finally:
            browser.close()
    assert not errors, errors
    t = st["t"]
    assert st["cut"] and st["stopped"] and st["sources"] == 0 and "cut" in st["cls"]
    assert 0 < t["audio_end_ms"] < st["samples"] * 1000 // 24000  # stopped mid-reply
    assert st["audioAfter"] == 0  # no audio of the interrupted reply after the user started speaking
    status, server_cut = st["done"][0]
    assert status == "cancelled"
    assert st["shown"] == t["text"] and st["div"] == (st["shown"].strip() or "…")
    # the server cut the reply at the same words (its estimate) and the page's report only shortens it
    assert server_cut.startswith(st["truncated"][0][2]) and st["truncated"][0][0] == t["item_id"]
    # the recognizer's words depend on where the VAD cut the browser's audio (timing under load: a CI
    # run heard "tell 11 story about the sea"); the turn itself is what this test is about
    assert "story about the sea" in st["users"][0], st["users"]
    assert "wait stop tell me about the moon instead" in " ".join(st["users"][1:])



def test_page_has_heading_text_input_svg_icon_partials_and_shows_errors(served, tmp_path):
    """What a person sees: a heading and an instruction line; the microphone's icon is inline SVG
    (drawn without any emoji font) beside a text input; a typed question is answered and its
    delegation listed; spoken words appear as partials, then final; a refused message is shown."""
    sync_playwright = _need_browser()
    wav = tmp_path / "hello.wav"
    mic_file(wav, [(0.8, "tell me a long story about the sea")], 12.0)
    with voice_server(served) as url, sync_playwright() as pw:
        browser, page, errors = open_page(pw, url, wav)
        try:
            page.wait_for_function("""window.agentState.events.some(
                e => e.type === 'conversation.item.input_audio_transcription.completed')""", timeout=60_000)
            page.wait_for_function("window.agentState.events.some(e => e.type === 'response.done')", timeout=60_000)
            page.fill("#text", "what is 12 times 11")
            page.press("#text", "Enter")
            page.wait_for_function("""Object.values(window.agentState.delegations).some(
                d => d.status === 'completed' && d.result === '132')""", timeout=60_000)
            page.evaluate("""() => { const t = document.getElementById('text'); t.value = 'x'.repeat(3000);
                document.getElementById('send').click(); }""")
            page.wait_for_function("window.agentState.errors.length > 0", timeout=30_000)
            icon = page.evaluate("""() => { const svg = document.querySelector('#mic svg');
                const r = svg.getBoundingClientRect(); return {w: r.width, h: r.height,
                paths: svg.querySelectorAll('path').length,
                label: document.getElementById('mic').textContent.trim()}; }""")
            st = page.evaluate("""() => { const s = window.agentState; return {
                h1: document.querySelector('h1').textContent, help: document.getElementById('help').textContent,
                input: document.getElementById('text').placeholder,
                partials: s.events.filter(e => e.type === 'conversation.item.input_audio_transcription.delta').length,
                typed: s.events.filter(e => e.type === 'conversation.item.added'
                                        && e.item.content[0].type === 'input_text').map(e => e.item.content[0].text),
                lines: [...document.querySelectorAll('.line.user')].map(d => d.textContent),
                dlg: document.getElementById('delegations').textContent,
                errors: document.getElementById('errors').textContent,
                td: s.events.filter(e => e.type === 'session.updated').map(
                    e => e.session.audio.input.turn_detection.type)}; }""")
        finally:
            browser.close()
    assert not errors, errors
    assert st["h1"] == "Talk to the execstate voice agent" and "Talk" in st["help"] and "type" in st["input"]
    assert icon["w"] >= 16 and icon["h"] >= 16 and icon["paths"] == 1 and icon["label"] == "Stop"  # the mic is on
    assert all(ord(c) < 0x2000 for c in icon["label"])  # no pictograph that needs an emoji font
    assert st["td"] == ["semantic_vad"]
    assert st["partials"] >= 1 and "story about the sea" in " ".join(st["lines"])
    assert st["typed"] == ["what is 12 times 11"] and "what is 12 times 11" in st["lines"]
    assert "calculator(12 times 11) → 132 (completed)" in st["dlg"]
    assert "invalid" in st["errors"] and "2048" in st["errors"]
