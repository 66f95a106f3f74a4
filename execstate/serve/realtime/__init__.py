"""The realtime WebSocket framework, and the protocols built on it.

Every realtime socket of the server (``/v1/realtime``: ``lm/``; ``/v1/realtime/video``:
``world/``; ``/v1/realtime/agent``: ``agent/``) is one protocol on this one framework, which holds,
once each:

==================  ===========================================================================
``messages.py``     the client message base (``Message``) and registry (``MessageTable``: type ->
                    struct, decoding, ``invalid_message`` / ``unknown_type`` / ``message_too_large``)
``errors.py``       the one error type (``ProtocolError``) and how exceptions become ``error`` events
``phases.py``       the connection phase machine (``PhaseMachine`` over a protocol's ``PhaseTable``)
``limits.py``       size and count limits (``Limits``)
``outbox.py``       the ordered, bounded outbox (back-pressure) and the close frame
``protocol.py``     ``RealtimeProtocol``: what defines a protocol (messages, phases, limits, errors)
``connection.py``   the dispatch: decode, phase check, handler, error mapping (``Connection``)
``endpoint.py``     the socket loop (reader, processor, single writer; subprotocol; close) and ``mount``
==================  ===========================================================================

Authentication is the app's, before the WebSocket upgrade (``serve/auth.py``).

**A new protocol takes one file of structs and one file of handlers**, and gets limits, errors,
phase checks, back-pressure and close handling from the framework:

- ``messages.py``: its client messages (``Message`` subclasses, each ``tag="<type>"`` with an
  ``event_id``), its phases (``Phase``, ``Move``, ``PhaseTable``) and its ``RealtimeProtocol``;
- ``handlers.py``: a class built from the connection's ``Peer`` (``emit``, ``emit_binary``,
  ``state``) whose ``routes`` map each message struct to an ``async`` handler and whose ``close``
  releases what the connection holds; and a function that serves it:
  ``mount(app, PATH, Endpoint(PROTOCOL, lambda peer: MyHandlers(peer, ...)))``.

So a new client message goes into its protocol's ``messages.py`` (a struct, and its type in the
phases that act on it) and its handler into the protocol's ``handlers.py`` (one method, one
``routes`` entry). tests/serve/test_realtime_framework.py defines a protocol that way, in the test
file, and drives it over a real WebSocket.
"""
