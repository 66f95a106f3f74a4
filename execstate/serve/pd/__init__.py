"""Prefill/decode disaggregation at the HTTP layer: the proxy in front of P and D servers
(``proxy.py``, its metrics ``proxy_metrics.py``). The PD connector's settings are
``serve/kv_transfer_config.py`` (``pd_config()``: the engine's ``EngineConfig.kv_transfer``); the
connector itself is ``engine/pd_connector.py``, built with the engine (``serve/server.py``)."""
