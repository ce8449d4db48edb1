"""Argument checks both sides of the API share: the embedded engine and the HTTP SDK refuse the same input
the same way, and the SDK refuses it before any request. Names, versions, times, durations, idempotency
keys and the ``create_table`` arguments; nothing here touches storage."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeGuard

import numpy as np
import pyarrow as pa

from superfile.arrow_input import schema_and_data
from superfile.errors import InvalidInputError, InvalidOptionError, InvalidTableNameError
from superfile.options import PartitionSpec, TableOptions, VectorColumn

__all__ = [
    "DEFAULT_RETENTION",
    "check_key",
    "check_name",
    "check_seconds",
    "check_version",
    "create_schema",
    "is_name",
    "namespace_of",
    "table_options",
    "to_ms",
]

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"
_NAME = re.compile(rf"{_SEGMENT}(?:\.{_SEGMENT}){{0,7}}")

# how long cleanup keeps past versions unless told otherwise
DEFAULT_RETENTION = datetime.timedelta(days=7)
MAX_KEY_LENGTH = 256


def check_name(name: object, what: str = "table") -> str:
    """A table or namespace name: up to 8 dot-separated parts (``team.docs``: table ``docs`` in namespace
    ``team``), each 1-128 letters, digits, '_' or '-' starting with a letter or digit, matched in full
    ("a\\n" is not "a"). The whole name is one storage path component (no '/', no empty or dot-only part),
    so no name can leave its table's storage prefix."""
    if not is_name(name):
        raise InvalidTableNameError(
            f"invalid {what} name {name!r}: use up to 8 dot-separated parts of 1-128 letters, digits, '_' or '-', "
            "each starting with a letter or digit"
        )
    return name


def is_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a valid table or namespace name (:func:`check_name` without the error)."""
    return isinstance(name, str) and len(name) <= 255 and _NAME.fullmatch(name) is not None


def namespace_of(name: str) -> str | None:
    """The namespace a checked table or namespace name sits in (None at the root)."""
    return name.rpartition(".")[0] or None


def check_version(version: object) -> int:
    """A version number is a positive integer (not a bool, not a string)."""
    if isinstance(version, bool) or not isinstance(version, int | np.integer) or version < 1:
        raise InvalidInputError(f"a version must be a positive integer, got {version!r}")
    return int(version)


def to_ms(as_of: datetime.datetime | int | float) -> int:
    """A point in time as epoch milliseconds: an aware datetime, a naive one (taken as UTC), or epoch ms."""
    if isinstance(as_of, datetime.datetime):
        if as_of.tzinfo is None:
            as_of = as_of.replace(tzinfo=datetime.UTC)
        return int(as_of.timestamp() * 1000)
    number = isinstance(as_of, int | float | np.integer | np.floating) and not isinstance(as_of, bool)
    if number and math.isfinite(as_of):
        return int(as_of)
    raise InvalidInputError(f"as_of must be a datetime or finite epoch milliseconds, got {as_of!r}")


def check_seconds(name: str, value: object) -> float:
    """A duration (a timedelta or seconds) as non-negative finite seconds."""
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise InvalidOptionError(f"{name} must be a non-negative timedelta or seconds, got {value!r}")
    return float(seconds)


def check_key(key: object) -> str:
    """An idempotency key is a non-empty string of at most 256 characters."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInputError(f"idempotency_key must be a non-empty string of at most {MAX_KEY_LENGTH} characters")
    return key


def create_schema(schema: pa.Schema | None, data: Any) -> tuple[pa.Schema, Any]:
    """The schema ``create_table`` was given, or the one of its ``data``; and the data to append in its
    place (a one-shot stream is opened once, so taking its schema does not spend its rows)."""
    if schema is None:
        if data is None:
            raise InvalidOptionError("create_table needs a schema or data")
        schema, data = schema_and_data(data)
    if not isinstance(schema, pa.Schema):
        raise InvalidInputError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    return schema, data


def _fts(fts_columns: Sequence[str] | Mapping[str, str], tokenizer: str | Mapping[str, str]) -> dict[str, str]:
    if isinstance(fts_columns, Mapping):
        return dict(fts_columns)
    if isinstance(fts_columns, str):
        fts_columns = [fts_columns]
    if isinstance(tokenizer, Mapping):
        return {c: tokenizer.get(c, "english") for c in fts_columns}
    return dict.fromkeys(fts_columns, tokenizer)


def _vectors(vector_columns: Mapping[str, Any] | None) -> dict[str, VectorColumn]:
    out = {}
    for name, spec in (vector_columns or {}).items():
        if isinstance(spec, VectorColumn):
            out[name] = spec
        elif isinstance(spec, Mapping):
            out[name] = VectorColumn(**spec)
        elif isinstance(spec, int) and not isinstance(spec, bool):
            out[name] = VectorColumn(spec)
        else:
            raise InvalidOptionError(f"vector column {name!r}: give {{'dim': N, 'metric': ...}}, got {spec!r}")
    return out


def _partition(partition: str | Mapping[str, str] | PartitionSpec | None) -> PartitionSpec | None:
    if partition is None or isinstance(partition, PartitionSpec):
        return partition
    if isinstance(partition, str):
        return PartitionSpec(partition)
    return PartitionSpec(**partition)


def table_options(
    *,
    fts_columns: Sequence[str] | Mapping[str, str] = (),
    vector_columns: Mapping[str, Any] | None = None,
    tokenizer: str | Mapping[str, str] = "english",
    partition: str | Mapping[str, str] | PartitionSpec | None = None,
    consistency: str = "strong",
    options: Mapping[str, Any] | None = None,
) -> TableOptions:
    """``create_table``'s keyword arguments as checked table options (the same typed error on both sides)."""
    unknown = set(options or {}) - {f.name for f in fields(TableOptions)}
    if unknown:
        raise InvalidOptionError(f"unknown table options: {sorted(unknown)}")
    return TableOptions(
        fts_columns=_fts(fts_columns, tokenizer),
        vector_columns=_vectors(vector_columns),
        partition=_partition(partition),
        consistency=consistency,
        **(options or {}),
    )
