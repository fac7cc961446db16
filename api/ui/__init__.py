"""The operators' fleet dashboard at /ui: its pages and session routes (routes.py), the
signed session cookie that stands in for the operator key in a browser (session.py), and
its static assets (static/), shipped in the package so the dashboard works offline."""
