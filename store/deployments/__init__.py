"""Deployments and the service clients that call them: their tables, the rules that move
a deployment (rules.py), the reconciler (reconcile.py), the gateway's routing
(routing.py), the runtime channels availability is read from (runtime_channels.py) and
the service clients' credentials (service_clients.py), in one place rather than spread
over the store."""
