"""Strict JSON both ways: JSON has no NaN, Infinity or -Infinity, and strict parsers (browsers, Go, serde, jq)
refuse the tokens Python's ``json`` writes and reads for them by default.

- **Out.** Rows go through ``superfile.remote.wire.table_to_json``, and the answers that may hold numbers (describe,
  stats, versions, properties, maintenance) through FastAPI's serialization of the route's return type (pydantic):
  both write a NaN or infinite number as ``null``. (A ``JSONResponse`` would refuse to write one and break the
  connection: keep it for answers of strings, as errors are.)
- **In.** :func:`loads` parses a request body and refuses those tokens, and numbers beyond a double's range
  (which Python reads as infinities), with a 400 that names the token and where it stood: ``InvalidVectorError``
  inside a query vector, as the engine refuses such a vector, else ``InvalidInputError``. :func:`strict_body`, a
  dependency of every route, reads a route's JSON body with it before the body is validated; the routes that read
  their bodies themselves (append, update) call it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import Request
from superfile.errors import InvalidInputError, InvalidVectorError

__all__ = ["is_json", "loads", "strict_body"]


class _NotJson(Exception):
    def __init__(self, token: str, overflow: bool = False) -> None:
        self.token = token
        self.overflow = overflow


def _refuse(constant: str) -> Any:
    raise _NotJson(constant)


def _double(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson(text, overflow=True)
    return value


# A number that may overflow a double (an exponent of three digits or more, or 309 digits in a row): only a body
# that has one pays for checking each float (a text may match too, harmlessly).
_MAYBE_HUGE = re.compile(rb"[eE]\+?\d{3}|\d{309}")


def loads(body: bytes) -> Any:
    """A request body's JSON document; a typed 400 for malformed JSON, for NaN, Infinity or -Infinity, and for
    a number beyond a double's range (``1e999``, which Python would read as an infinity)."""
    try:
        if _MAYBE_HUGE.search(body):
            return json.loads(body, parse_constant=_refuse, parse_float=_double)
        return json.loads(body, parse_constant=_refuse)
    except _NotJson as e:
        raise _refusal(body, e) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"malformed JSON body: {e}") from None


def _refusal(body: bytes, refused: _NotJson) -> InvalidInputError:
    """The error for a body holding the refused token, naming where it stood (found by a lenient parse, on this
    error path only)."""
    try:
        path = _first_non_finite(json.loads(body))
    except (ValueError, RecursionError):  # malformed after the token: the token is the first thing wrong
        path = None
    token = refused.token
    where = f" at {''.join(path).lstrip('.') or 'the top'}" if path is not None else ""
    what = "is beyond a double's range" if refused.overflow else "is not JSON, which has no NaN or infinities"
    if path and path[0] == ".vector":
        return InvalidVectorError(f"{token}{where} {what}: a query vector must hold finite numbers")
    return InvalidInputError(f"{token}{where} {what}: send a finite number, or null for a missing one")


def _first_non_finite(doc: Any) -> list[str] | None:
    """The path (``[".rows", "[0]", ".x"]``) of the first NaN or infinite number in ``doc``, depth first."""
    stack: list[tuple[Any, list[str]]] = [(doc, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path
        if isinstance(value, dict):
            stack.extend((v, [*path, f".{k}"]) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, [*path, f"[{i}]"]) for i, v in reversed(list(enumerate(value))))
    return None


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this content type as JSON (``application/json``, ``application/*+json``);
    without a content type it does not (its strict content-type rule)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def strict_body(request: Request) -> None:
    """An app-wide dependency (``create_app`` gives it to every route, so a router added later is covered too):
    a route's JSON body model is read by FastAPI with Python's lenient parser, so the body is read again with
    :func:`loads` here, first among the route's dependencies, and a NaN, an infinity or a number beyond a
    double's range is refused before anything runs (the body is cached: a search's body costs microseconds).
    Routes without a body model (append and update read theirs with :func:`loads`) are left alone."""
    route = request.scope.get("route")
    if getattr(route, "body_field", None) is None or not is_json(request.headers.get("content-type")):
        return
    body = await request.body()
    if body:
        loads(body)
