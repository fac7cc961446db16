"""The OpenAI-compatible gateway for service clients (GATEWAY_PREFIX, schemas/protocol.py):
routing, the invoke relay over the runtime workers' held channels, route receipts."""
