"""Speech around the duplex agent runtime: audio in (VAD, ASR), audio out (TTS, paced playback).

Layer: above ``agent/`` (it drives a ``DuplexAgent``), below ``serve/`` (which never reaches into
it except through ``VoiceAgent``'s public calls). Nothing here imports ``serve/``.
"""
