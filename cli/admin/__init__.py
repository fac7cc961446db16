"""`modelforge admin …`: the operator's command line over the admin API (cli/admin/app.py)."""
