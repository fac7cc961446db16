"""Model services (schemas/services.py): the tables, the operators' rules
(store/services/rules.py), the scheduler's placement (store/services/placement.py) and the
reconciler's decisions (store/services/reconcile.py), shared by the API and the workers."""
