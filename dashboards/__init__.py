"""laggard.dashboards: Grafana dashboards and Prometheus rules for laggard's metrics.

One module per dashboard (``job_overview``, ``node_gpus``, ``network``, ``communication``), each
a ``build()`` made with grafana-foundation-sdk on the shared blocks of ``panels``; ``catalog``
lists them and renders the files that ``laggard dashboards`` (``cli``) writes. The Prometheus
rule files live in ``rules/``, rendered dashboards in ``generated/``.
"""
