"""Argument checks both sides of the API share: the embedded engine and the HTTP SDK refuse the same input
the same way, and the SDK refuses it before any request."""

from __future__ import annotations

import re

from superfile.errors import InvalidTableNameError

__all__ = ["check_name"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def check_name(name: object) -> str:
    """A table name: 1-128 letters, digits, '_' or '-', starting with a letter or digit, matched in full
    ("a\\n" is not "a"), so no name can leave its table's storage prefix."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidTableNameError(
            f"invalid table name {name!r}: use 1-128 letters, digits, '_' or '-', starting with a letter or digit"
        )
    return name
