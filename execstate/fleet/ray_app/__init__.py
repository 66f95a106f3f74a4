"""The fleet on Ray Serve (docs/fleet.md): ``app.py`` builds the application (ingress + engine
replicas + the custom ``RequestRouter``). Needs Ray Serve, the ``fleet`` extra: importing this
package without it raises ``ImportError`` saying so."""

try:
    import ray.serve  # noqa: F401
except ImportError as e:  # pragma: no cover - the packaging test checks it in a venv without extras
    raise ImportError(f"execstate.fleet.ray_app needs Ray Serve: pip install 'execstate[fleet]' ({e})") from e
