"""The REST gateway: the Connection API over HTTP."""
