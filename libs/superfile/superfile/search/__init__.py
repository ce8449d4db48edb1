"""Distributed reads: a query root plans against a pinned manifest and fans out to cache nodes (leaves).

- ``placement.py``: which node owns which superfile (rendezvous hashing).
- ``leaf.py``: one leaf request and the engine code that answers it on a cache node.
- ``fleet.py``: the root's view of the cache nodes: membership, health, calls with retries and hedging.
- ``root.py``: the searcher that plans, fans out and merges.
- ``request.py``: a search as one value (``SearchRequest``), the same for the handle, SQL, the SDK and the
  gateway; pure data, so the SDK imports it without the engine.

Embedded reads run the same ``Searcher`` in process; see docs/query.md.

Import the modules themselves: this package imports nothing, so ``request.py`` stays free of the engine.
"""
