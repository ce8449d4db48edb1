"""API keys: who is calling (401 when unknown) and what that key may do to which table (403)."""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from superfile.errors import InvalidInputError
from superfile.remote.errors import AuthenticationError, PermissionDeniedError

from superfile_gateway.settings import ApiKey

__all__ = ["KEY_PARAMETERS", "KeyRing", "Principal", "RedactKeysInUrls", "principal_of_grants", "refuse_keys_in_url"]

_WORD = {"r": "read", "w": "write"}
# Query parameters that would carry a credential: refused, and redacted wherever a URL is logged.
KEY_PARAMETERS = frozenset({"api_key", "apikey", "api-key", "x-api-key", "access_token", "token", "authorization"})
_NAMES = "|".join(re.escape(k) for k in sorted(KEY_PARAMETERS))
_KEY_IN_URL = re.compile(rf"(?i)([?&](?:{_NAMES})=)[^&\s]*")


def refuse_keys_in_url(parameters: Iterable[str]) -> None:
    """A key in a URL ends up in access logs, proxies and browser history: such a request is refused (400)."""
    named = sorted({p for p in parameters if p.lower() in KEY_PARAMETERS})
    if named:
        raise InvalidInputError(
            f"query parameter {named[0]!r} looks like a credential: send API keys in the Authorization or "
            "X-API-Key header, never in the URL"
        )


class RedactKeysInUrls(logging.Filter):
    """Blanks credential-like query parameters in log records (uvicorn's access log prints the whole URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_KEY_IN_URL.sub(r"\1[redacted]", a) if isinstance(a, str) else a for a in record.args)
        return True


@dataclass(frozen=True)
class Principal:
    """The grants of the key a request presented (``unrestricted`` when authentication is off)."""

    grants: tuple[ApiKey, ...]
    unrestricted: bool = False

    def can(self, table: str, scope: str) -> bool:
        return self.unrestricted or any(
            scope in g.scopes and fnmatch.fnmatchcase(table, g.table_glob) for g in self.grants
        )

    def require(self, table: str, scope: str) -> None:
        if not self.can(table, scope):
            raise PermissionDeniedError(f"this API key may not {_WORD[scope]} table {table!r}")

    @property
    def identity(self) -> bytes:
        """Which key this is, for per-key caps (the key's digest; empty when authentication is off)."""
        return self.grants[0].digest if self.grants else b""

    def visible(self, table: str) -> bool:
        """Whether the table shows up for this key at all (any scope on it)."""
        return self.can(table, "r") or self.can(table, "w")


class KeyRing:
    """The configured keys, held as SHA-256 digests and compared in constant time."""

    def __init__(self, keys: Sequence[ApiKey], *, enabled: bool = True) -> None:
        self._enabled = enabled
        self._by_digest: dict[bytes, tuple[ApiKey, ...]] = {}
        for k in keys:
            self._by_digest[k.digest] = (*self._by_digest.get(k.digest, ()), k)

    def authenticate(self, authorization: str | None, x_api_key: str | None) -> Principal:
        """The principal for ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; raises 401 otherwise."""
        if not self._enabled:
            return Principal((), unrestricted=True)
        presented = x_api_key
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationError("the Authorization header must be 'Bearer <api key>'")
            presented = token.strip()
        if not presented:
            raise AuthenticationError("an API key is required (Authorization: Bearer <key> or X-API-Key)")
        digest = hashlib.sha256(presented.encode()).digest()
        found: tuple[ApiKey, ...] = ()
        for stored, grants in self._by_digest.items():  # every entry is compared: no early exit on a match
            if hmac.compare_digest(digest, stored):
                found = grants
        if not found:
            raise AuthenticationError("unknown API key")
        return Principal(found)


def principal_of_grants(header: str) -> Principal:
    """The caller a gateway forwarded a read for (``forward.grants_header``): its grants, and its key's digest
    for the per-key caps. Trusted only on a request that presented the internal token."""
    try:
        body = json.loads(header)
        grants = tuple(
            ApiKey(bytes.fromhex(body["key"]), str(glob), frozenset(str(scopes))) for glob, scopes in body["grants"]
        )
        return Principal(grants, unrestricted=bool(body["unrestricted"]))
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidInputError(f"malformed forwarded grants: {e}") from None
