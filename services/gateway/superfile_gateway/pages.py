"""The pages a person opens on the gateway, every asset served by the gateway itself (no CDN: they work offline):

- ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) over ``/openapi.json``, FastAPI's "self-hosting JavaScript and
  CSS for docs" recipe with the assets the ``fastapi-offline`` package ships (MIT; Swagger UI is Apache-2.0,
  ReDoc MIT) under ``/assets/docs``;
- ``/``, the search playground: one static page and script (``playground/`` in this package, no build step) that
  calls the REST API with the key typed into it (``docs/gateway.md``, "The playground").

Like ``/openapi.json`` they need no key: the playground sends the key with each API call it makes.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["DOCS_ASSETS", "PLAYGROUND_ASSETS", "install_pages"]

DOCS_ASSETS = "/assets/docs"
PLAYGROUND_ASSETS = "/assets/playground"
_PLAYGROUND = Path(__file__).parent / "playground"
# the playground runs its own script and talks to its own origin only: no inline script, nothing from elsewhere
_PLAYGROUND_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def install_pages(app: FastAPI) -> None:
    """``/docs``, ``/redoc``, ``/`` and their assets on ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    docs_assets = Path(str(files("fastapi_offline").joinpath("static")))
    app.mount(DOCS_ASSETS, StaticFiles(directory=docs_assets), name="docs-assets")
    app.mount(PLAYGROUND_ASSETS, StaticFiles(directory=_PLAYGROUND), name="playground-assets")

    def under(request: Request, path: str) -> str:
        """``path`` below the prefix the gateway is mounted at (a proxy's ``root_path``)."""
        return f"{request.scope.get('root_path', '').rstrip('/')}{path}"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=under(request, app.openapi_url or "/openapi.json"),
            title=f"{app.title}: API docs",
            swagger_js_url=under(request, f"{DOCS_ASSETS}/swagger-ui-bundle.js"),
            swagger_css_url=under(request, f"{DOCS_ASSETS}/swagger-ui.css"),
            swagger_favicon_url=under(request, f"{DOCS_ASSETS}/favicon.png"),
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=under(request, app.openapi_url or "/openapi.json"),
            title=f"{app.title}: API reference",
            redoc_js_url=under(request, f"{DOCS_ASSETS}/redoc.standalone.js"),
            redoc_favicon_url=under(request, f"{DOCS_ASSETS}/favicon.png"),
            with_google_fonts=False,
        )

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(_PLAYGROUND / "index.html", headers={"Content-Security-Policy": _PLAYGROUND_POLICY})
