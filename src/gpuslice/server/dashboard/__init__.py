"""The web dashboard of ``gpuslice serve``: static HTML, CSS and plain JavaScript, no build step.

```text
GET /  and  /dashboard        the page (index.html)
GET /dashboard/{file}         its script, style sheet and icon (the files in static/)
```
The page reads the same read-only JSON API as everyone else (/v1/health, /v1/gpus, /v1/jobs, /v1/queue,
/v1/events) every 2 s, with the read-only cookie that the sign-in link printed by ``gpuslice serve``
leaves (guard.py; no cookie is needed with --public-reads). The page itself holds no data.
Everything it shows from the API is user input somewhere (commands,
reasons), so the script only ever sets text, never HTML, and the Content-Security-Policy below refuses
inline scripts, inline styles and every source but this server: an injected ``<img onerror=…>`` or
``<script>`` cannot run even if a bug let one into the page.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response

__all__ = ["CONTENT_SECURITY_POLICY", "mount"]

# Only this server: scripts and styles from files (no inline ones, no eval), data from /v1, no frames,
# no forms, no plugins. Styles set through the DOM (element.style.width) are not inline styles to CSP.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate, so an upgraded server serves its new page at once
}


def mount(app: FastAPI) -> None:
    """Add the dashboard's routes to ``app`` (kept out of the OpenAPI schema: they are not the API)."""
    static = files(__package__) / "static"
    # Read once: the files are part of the installed package and never change while it runs.
    contents = {name: (static / name).read_bytes() for name in _MEDIA_TYPES}

    def serve(name: str) -> Response:
        return Response(contents[name], media_type=_MEDIA_TYPES[name], headers=_HEADERS)

    @app.get("/", include_in_schema=False)
    @app.get("/dashboard", include_in_schema=False)
    def page() -> Response:
        return serve("index.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in contents or name == "index.html":
            return Response(
                f"no dashboard file {name!r}; the dashboard is at /\n",
                status_code=404,
                media_type="text/plain; charset=utf-8",
                headers=_HEADERS,
            )
        return serve(name)
