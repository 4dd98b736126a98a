"""The read-only web console.

A party's own view (its jobs, datasets, policy and audit log), and the coordinator's
consortium view (jobs and rounds).

`server.py` serves it over HTTPS with mutual TLS (the deployment's CA; only the client
certificates `console_users` names), `sources.py` gathers what the pages show, `pages.py` renders
them as HTML that needs no JavaScript, `charts.py` draws the charts as SVG with matplotlib.
"""
