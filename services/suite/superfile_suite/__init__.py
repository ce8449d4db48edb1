"""The service suite as local processes: the broker, S3 server and Redis the services need, and the read
path's cache nodes and query roots, on 127.0.0.1."""

from superfile_suite.servers import (
    Server,
    free_port,
    start_cache_node,
    start_moto,
    start_query,
    start_redis,
    start_tansu,
)

__all__ = ["Server", "free_port", "start_cache_node", "start_moto", "start_query", "start_redis", "start_tansu"]
