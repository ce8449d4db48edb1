"""The SDK over HTTP: ``superfile.connect("http://host:port", api_key=...)`` returns a :class:`RemoteConnection`.

Its tables (:class:`RemoteTable`) have the methods, arguments and result
types of embedded ones (``pa.Table`` results, ``superfile.errors`` types),
talking to a gateway (``superfile serve`` or ``python -m superfile_gateway``).
"""

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
