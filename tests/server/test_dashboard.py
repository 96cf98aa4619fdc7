"""The dashboard's routes and files (server/dashboard/), in-process: what is served, with which headers, and
that the page can only ever show the API's data as text. The browser test (test_dashboard_browser.py)
checks what the page shows against a real server."""

from __future__ import annotations

import fnmatch
import re
import tomllib
import warnings
from pathlib import Path

import pytest

from gpuslice.server import dashboard
from gpuslice.server.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

STATIC = Path(dashboard.__file__).parent / "static"
REPO = Path(__file__).resolve().parents[2]
JS = (STATIC / "dashboard.js").read_text()


@pytest.fixture
def http(daemon):
    with TestClient(create_app(daemon, "token"), headers={"Authorization": "Bearer token"}) as client:
        yield client


def csp_directives(header: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in header.split(";")) if d}


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_the_page_is_served_with_a_policy_that_forbids_inline_and_remote_code(http, path):
    r = http.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>gpuslice</title>" in r.text
    policy = csp_directives(r.headers["content-security-policy"])
    assert policy["default-src"] == ["'none'"]
    for directive in ("script-src", "style-src", "connect-src", "img-src"):
        assert policy[directive] == ["'self'"], directive  # no 'unsafe-inline', no other host
    assert policy["frame-ancestors"] == ["'none'"]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_every_file_the_page_links_is_served_with_its_type(http):
    page = http.get("/").text
    linked = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sorted(linked) == ["dashboard/dashboard.css", "dashboard/dashboard.js", "dashboard/favicon.svg"]
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for link in linked:
        r = http.get("/" + link)
        assert r.status_code == 200, link
        assert r.headers["content-type"].startswith(types[Path(link).suffix])
        assert r.content == (STATIC / Path(link).name).read_bytes()


@pytest.mark.parametrize("name", ["missing.js", "index.html", "..%2Fapp.py"])
def test_other_dashboard_paths_are_404(http, name):
    assert http.get(f"/dashboard/{name}").status_code == 404


def test_the_dashboard_is_not_part_of_the_api_schema(http):
    paths = http.get("/openapi.json").json()["paths"]
    assert paths and not [p for p in paths if p == "/" or p.startswith("/dashboard")]


def test_the_page_has_no_inline_code_and_nothing_from_other_hosts():
    page = (STATIC / "index.html").read_text()
    for script in re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S):
        assert "src=" in script[0] and not script[1].strip(), "inline script"
    assert not re.search(r"\son[a-z]+\s*=", page), "inline event handler"
    assert not re.search(r"\sstyle\s*=", page), "inline style"
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        text = (STATIC / name).read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), f"{name} names another host"
        assert "@import" not in text and "@font-face" not in text, name


def test_the_script_only_ever_sets_text():
    code = re.sub(r"//[^\n]*", "", JS)  # comments may name what is avoided
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                 "setAttribute(\"style\"", "setAttribute(\"on"):  # fmt: skip
        assert sink not in code, sink


def test_the_api_reads_the_page_makes_need_no_token(http):
    # Every URL the script reads, with its ${…} parts filled in as on a first load.
    reads = re.findall(r'getJson\(\s*[`"](v1/[^`"]+)[`"]', JS)
    assert {r.split("?")[0] for r in reads} == {"v1/health", "v1/gpus", "v1/queue", "v1/jobs", "v1/events"}
    values = {"last": "0", "EVENT_PAGE": "1000", "FINISHED_SHOWN": "12"}
    for read in reads:
        url = re.sub(r"\$\{([^}]+)\}", lambda m: values[m.group(1)], read)
        assert http.get("/" + url).status_code == 200, url


def test_package_data_ships_every_dashboard_file():
    """A non-editable install (CI's) carries only what pyproject's package-data names."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["gpuslice.server.dashboard"]
    for path in (REPO / "src" / "gpuslice" / "server" / "dashboard" / "static").iterdir():  # the source tree
        relative = f"static/{path.name}"
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative
