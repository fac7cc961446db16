"""Pure ASGI middleware, one concern each."""
