"""The REST gateway: the Connection API over HTTP (``create_app(Settings(...))``, ``python -m superfile_gateway``).

The names below are imported on first use, so that importing a light submodule (``superfile_gateway.cli``,
which every ``superfile`` command loads to offer ``serve``) does not import FastAPI and uvicorn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from superfile_gateway.app import Gateway, create_app
    from superfile_gateway.server import BackgroundServer
    from superfile_gateway.settings import ApiKey, ConfigError, Settings, parse_api_keys

__all__ = ["ApiKey", "BackgroundServer", "ConfigError", "Gateway", "Settings", "create_app", "parse_api_keys"]

_HOMES = {
    "Gateway": "superfile_gateway.app",
    "create_app": "superfile_gateway.app",
    "BackgroundServer": "superfile_gateway.server",
    "ApiKey": "superfile_gateway.settings",
    "ConfigError": "superfile_gateway.settings",
    "Settings": "superfile_gateway.settings",
    "parse_api_keys": "superfile_gateway.settings",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'superfile_gateway' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
