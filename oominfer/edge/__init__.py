"""The hardened HTTP edge that every public port of oominfer stands behind.

One place for what a server facing clients must hold, shared by ``oominfer serve``'s front
(whatever the engine behind it) and the transformers engine's own server:

- ``errors``: the OpenAI error shape and the statuses the edge answers with.
- ``limits``: what clients may hold and send (connections, idle and slow time, body size).
- ``connections``: uvicorn's h11 protocol with the connection cap and the request timeout.
- ``gate``: ASGI middleware: API key, draining, body size, in-flight count, request metrics.
- ``metrics``: request counters through ``prometheus_client``, one registry per server.

Importing it loads uvicorn, starlette and prometheus_client (no torch, no engine): the pure
core never imports it.
"""
