"""The fleet on Ray Serve (docs/fleet.md): ``app.py`` builds the application (ingress + engine
replicas + the custom ``RequestRouter``); imports Ray (the ``fleet`` extra)."""
