"""Prefill/decode disaggregation at the HTTP layer: the proxy in front of P and D servers
(``proxy.py``, its metrics ``proxy_metrics.py``). The PD connector's settings are
``serve/kv_transfer_config.py``; the connector itself is ``engine/pd_connector.py``, attached by
``serve/server.py``."""
