"""The REST gateway: the Connection API over HTTP (``create_app(Settings(...))``, ``python -m superfile_gateway``)."""

from superfile_gateway.app import Gateway, create_app
from superfile_gateway.server import BackgroundServer
from superfile_gateway.settings import ApiKey, ConfigError, Settings, parse_api_keys

__all__ = ["ApiKey", "BackgroundServer", "ConfigError", "Gateway", "Settings", "create_app", "parse_api_keys"]
