"""The gateway's REST routes, one router per resource (``create_app`` includes them in this order):

- ``namespaces.py``: list, create, drop namespaces;
- ``tables.py``: the catalog and a table's metadata (list, create, describe, drop, version, stats, properties,
  idempotency, versions);
- ``writes.py``: append, update, delete, restore;
- ``search.py``: one ``POST /tables/{name}/search/{kind}`` per kind of ``superfile.search.request``;
- ``reads.py``: scan, count, changes;
- ``maintenance.py``: optimize, cleanup;
- ``schema.py``: schema evolution (columns added, renamed, retyped, dropped; indexes created and dropped);
- ``sql.py``: ``POST /sql``;
- ``forward.py``: with a query service, the routes that send reads there (included ahead of the others).

``RESOURCES`` are the routers but ``forward``'s. The process's own endpoints (``/healthz``, ``/readyz``,
``/metrics``) stay in ``app.py`` beside the app they report on. Routes take the Gateway, the caller and the
snapshot from ``superfile_gateway.deps``.
"""

from superfile_gateway.routes import maintenance, namespaces, reads, schema, search, sql, tables, writes

__all__ = ["RESOURCES"]

RESOURCES = (
    namespaces.router,
    tables.router,
    writes.router,
    search.router,
    reads.router,
    maintenance.router,
    schema.router,
    sql.router,
)
"""The routers of the API's resources, in the order ``create_app`` includes them."""
