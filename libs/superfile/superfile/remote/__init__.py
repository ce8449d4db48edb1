"""The SDK over HTTP: ``superfile.connect("http://host:port", api_key=...)`` returns a :class:`RemoteConnection`,
``await superfile.connect_async("http://host:port", api_key=...)`` an :class:`AsyncRemoteConnection`.

Its tables (:class:`RemoteTable`, :class:`AsyncRemoteTable`) have the methods, arguments and result
types of embedded ones (``pa.Table`` results, ``superfile.errors`` types),
talking to a gateway (``superfile serve`` or ``python -m superfile_gateway``).
The API key defaults to ``SUPERFILE_API_KEY`` from the environment.
"""

from superfile.remote.async_db import AsyncRemoteConnection
from superfile.remote.async_table import AsyncRemoteTable
from superfile.remote.db import RemoteConnection
from superfile.remote.errors import (
    AuthenticationError,
    GatewayError,
    GatewayUnavailableError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QueryCrashedError,
    QueryTimeoutError,
    TooManyRequestsError,
    VisibilityTimeoutError,
)
from superfile.remote.table import RemoteTable

__all__ = [
    "AsyncRemoteConnection",
    "AsyncRemoteTable",
    "AuthenticationError",
    "GatewayError",
    "GatewayUnavailableError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueryCrashedError",
    "QueryTimeoutError",
    "RemoteConnection",
    "RemoteTable",
    "TooManyRequestsError",
    "VisibilityTimeoutError",
]
