"""/docs and /redoc without a CDN: their assets are served by the API itself.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on an offline or firewalled
control plane they render blank. The assets come from the `fastapi-offline` wheel (a
server extra, pyproject.toml), whose static files track the Swagger UI 5 and ReDoc 2
that FastAPI's pages name; only its files are used, mounted under DOCS_ASSETS, and the
pages are FastAPI's own (get_swagger_ui_html, get_redoc_html) pointed at them. The
security schemes that make Authorize work are the authentication dependencies' own
(api/deps.py, api/gateway/auth.py).
"""

from __future__ import annotations

from importlib.resources import files
from typing import Final

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS: Final = "/docs"
REDOC: Final = "/redoc"
DOCS_ASSETS: Final = "/docs/assets"
SWAGGER_JS: Final = "swagger-ui-bundle.js"
SWAGGER_CSS: Final = "swagger-ui.css"
REDOC_JS: Final = "redoc.standalone.js"
FAVICON: Final = "favicon.png"


def install_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc from local assets; the app must be built with
    docs_url=None and redoc_url=None, so FastAPI's CDN pages are never added."""
    assert app.docs_url is None and app.redoc_url is None, "FastAPI's CDN pages are on"
    openapi_url = app.openapi_url
    assert openapi_url is not None
    directory = files("fastapi_offline") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(directory)), name="docs-assets")

    def root(request: Request) -> str:
        # Behind a proxy that strips a prefix (root_path), as FastAPI's own pages do.
        prefix: str = request.scope.get("root_path", "")
        return prefix.rstrip("/")

    @app.get(DOCS, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        base = root(request) + DOCS_ASSETS
        return get_swagger_ui_html(
            openapi_url=root(request) + openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{base}/{SWAGGER_JS}",
            swagger_css_url=f"{base}/{SWAGGER_CSS}",
            swagger_favicon_url=f"{base}/{FAVICON}",
            # No OAuth2 flow here: the schemes are an API key and two bearers.
            oauth2_redirect_url=None,
            # Swagger UI would fetch a validity badge from the internet otherwise.
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None},
        )

    @app.get(REDOC, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        base = root(request) + DOCS_ASSETS
        return get_redoc_html(
            openapi_url=root(request) + openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{base}/{REDOC_JS}",
            redoc_favicon_url=f"{base}/{FAVICON}",
            # The fonts are a CDN too; ReDoc falls back to the browser's own.
            with_google_fonts=False,
        )
