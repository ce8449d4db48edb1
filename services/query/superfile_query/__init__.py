"""A query root: the gateway's read routes over a connection whose reads fan out to cache nodes."""

from superfile_query.app import create_app, query_settings

__all__ = ["create_app", "query_settings"]
