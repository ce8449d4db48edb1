"""A cache node: the leaf of the distributed read path (docs/query.md)."""

from superfile_cache.app import CacheNode, create_app

__all__ = ["CacheNode", "create_app"]
