"""Errors that exist only over HTTP, and the mapping of error type names back to classes.

The gateway answers every failure with ``{"error": {"type": <class name>, "message": ...}}``;
the SDK raises the class of that name, so remote callers catch the same types as embedded ones.
"""

from __future__ import annotations

import json

import superfile.errors as engine_errors
from superfile.errors import InvalidInputError, StorageError, SuperfileError

__all__ = [
    "AuthenticationError",
    "GatewayError",
    "GatewayUnavailableError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QueryCrashedError",
    "QueryTimeoutError",
    "TooManyRequestsError",
    "VisibilityTimeoutError",
    "error_class",
    "error_from_response",
    "error_of",
]


class AuthenticationError(SuperfileError):
    """No API key, or one the gateway does not know."""

    http_status = 401


class PermissionDeniedError(SuperfileError):
    """The API key is valid but has no scope for this table and operation."""

    http_status = 403


class PayloadTooLargeError(InvalidInputError):
    """The request body is larger than the gateway accepts; nothing was written."""

    http_status = 413


class VisibilityTimeoutError(SuperfileError):
    """A write's position did not become visible in the table within the wait bound (it may still)."""

    http_status = 504


class TooManyRequestsError(SuperfileError):
    """The gateway is running as many queries as it admits (for this key, or in all); retry after a pause
    (the answer's ``Retry-After``)."""

    http_status = 429


class QueryTimeoutError(SuperfileError):
    """A SQL query ran past the gateway's time limit and was stopped (its worker process killed)."""

    http_status = 504


class QueryCrashedError(SuperfileError):
    """The process running a SQL query died (a native crash, or its address-space limit); the gateway
    replaced it and is unharmed. The message names the signal."""

    http_status = 500


class GatewayUnavailableError(StorageError):
    """The gateway could not be reached (connection refused, reset, timed out)."""

    http_status = 503


class GatewayError(SuperfileError):
    """An error the gateway reported with a type this SDK does not know."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status


_REMOTE = {
    c.__name__: c
    for c in (
        AuthenticationError,
        PermissionDeniedError,
        PayloadTooLargeError,
        VisibilityTimeoutError,
        GatewayUnavailableError,
        TooManyRequestsError,
        QueryTimeoutError,
        QueryCrashedError,
    )
}
_BY_STATUS: dict[int, type[SuperfileError]] = {
    400: InvalidInputError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: engine_errors.TableNotFoundError,
    413: PayloadTooLargeError,
    422: InvalidInputError,
    429: TooManyRequestsError,
    504: VisibilityTimeoutError,
}


def error_class(type_name: str | None, status: int) -> type[SuperfileError] | None:
    """The class named ``type_name`` (engine or remote), else the usual class of ``status``, else None."""
    if type_name in _REMOTE:
        return _REMOTE[type_name]
    if type_name in engine_errors.__all__:
        cls = getattr(engine_errors, type_name)
        if isinstance(cls, type) and issubclass(cls, SuperfileError):
            return cls
    return _BY_STATUS.get(status)


def error_from_response(status: int, body: bytes) -> SuperfileError:
    """The typed error an error response of a gateway (or a query or cache node) describes:
    ``{"error": {"type": <class name>, "message": ...}}``, else the usual class of the status."""
    type_name, message = None, body.decode(errors="replace") or f"HTTP {status}"
    try:
        error = json.loads(body)["error"]
        type_name, message = error.get("type"), error.get("message", message)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    cls = error_class(type_name, status)
    if cls is None:
        return GatewayError(message, status)
    return error_of(cls, message)


def error_of(cls: type[SuperfileError], message: str) -> SuperfileError:
    """An instance of ``cls`` carrying ``message``, also for a class whose constructor takes structured
    arguments (``SuperfileMissingError(path, table=...)``): the type is kept, the message carried."""
    try:
        return cls(message)
    except TypeError:
        exc = cls.__new__(cls)
        exc.args = (message,)
        return exc
