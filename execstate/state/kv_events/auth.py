"""Who may read a KV events feed: loopback by default, ZeroMQ CURVE from the shared ring elsewhere.

A feed names the blocks a replica holds (and, when the operator opts in, their tokens): it must
not reach whoever can open a TCP connection. So:

- An endpoint on loopback (``127.0.0.1``, ``::1``, ``localhost``) or an ``ipc://`` / ``inproc://``
  one needs nothing more: only processes on the machine reach it.
- Any other endpoint (a host's address, ``*``) is served with **CURVE**: encrypted, and a
  subscriber must prove it holds the instances' shared secret (``identity/secret_ring.py``). Both
  key pairs are derived from the ring's current secret (``HMAC-SHA256(secret, domain)``: 32 bytes
  are a CURVE secret key), so whoever holds ``EXECSTATE_KV_SECRET`` can subscribe and nobody else
  can: the publisher's ZAP handler accepts exactly the client keys derived from the secrets its
  ring accepts (the current and the previous ones of a rotation). Without a ring a non-loopback
  endpoint is refused at start-up.

Each secured publisher has its own ZeroMQ context (a ZAP handler serves one context).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from urllib.parse import urlsplit

import zmq
import zmq.auth.thread
from zmq.utils import z85

from execstate.identity.secret_ring import SecretRing

ZAP_DOMAIN = "execstate-kv-events"
_SERVER = b"execstate/v1/kv-events-curve/server"
_CLIENT = b"execstate/v1/kv-events-curve/client"


def is_loopback(endpoint: str) -> bool:
    """True for an endpoint only this machine can reach (module docstring)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # '*', an interface name or a host name: not provably loopback
        return False


def _keypair(secret: bytes, domain: bytes) -> tuple[bytes, bytes]:
    private = z85.encode(hmac.new(secret, domain, hashlib.sha256).digest())
    return zmq.curve_public(private), private


def server_public_key(ring: SecretRing) -> bytes:
    """The publisher's CURVE public key (Z85) a subscriber needs."""
    return _keypair(ring.current, _SERVER)[0]


class _ClientKeys:
    """ZAP callback: accept a client whose key is derived from a secret the ring accepts."""

    def __init__(self, ring: SecretRing) -> None:
        self._allowed = {_keypair(s, _CLIENT)[0] for s in (ring.current, *ring.previous)}

    def callback(self, domain: str, key: bytes) -> bool:
        return z85.encode(key) in self._allowed if len(key) == 32 else key in self._allowed


def secure_server(ctx: zmq.Context[zmq.Socket[bytes]], sockets: list[zmq.Socket[bytes]],
                  ring: SecretRing) -> zmq.auth.thread.ThreadAuthenticator:
    """Make ``sockets`` (not yet bound) CURVE servers under ``ring``; the started authenticator
    (stop it with the context)."""
    auth = zmq.auth.thread.ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=_ClientKeys(ring))
    public, private = _keypair(ring.current, _SERVER)
    for sock in sockets:
        sock.curve_secretkey = private
        sock.curve_publickey = public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()
    return auth


def secure_client(sock: zmq.Socket[bytes], ring: SecretRing) -> None:
    """Make ``sock`` (not yet connected) a CURVE client of a publisher secured with ``ring``."""
    public, private = _keypair(ring.current, _CLIENT)
    sock.curve_secretkey = private
    sock.curve_publickey = public
    sock.curve_serverkey = server_public_key(ring)
