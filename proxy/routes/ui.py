"""The web tree viewer (docs/viewer.md): the static files of ``proxy/ui`` served at ``/ui``.

Plain ES modules, no build step and nothing fetched from elsewhere: the page talks only to this
server's admin and chat APIs, which is also what its Content-Security-Policy allows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, Router
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import NotFoundException
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

__all__ = ["UI_DIRECTORY", "ui_router"]

UI_DIRECTORY = Path(__file__).resolve().parent.parent / "ui"

_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _secure(response: Response) -> Response:
    response.headers.update(_HEADERS)
    return response


def _slash(request: Request[Any, Any, Any]) -> Redirect | None:
    """``/ui`` -> ``/ui/``, so that the page's relative URLs resolve under it. A path no file of
    the viewer could have -- a control character, a name longer than a file system takes -- is
    a 404 here, before the file system is asked (which would fail on it)."""
    name = request.scope.get("path", "")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name) or any(len(part.encode()) > 255 for part in name.split("/")):
        raise NotFoundException()
    path = request.scope.get("raw_path", b"").split(b"?", 1)[0]
    if not path.endswith(b"/ui"):
        return None
    return Redirect(path.decode("latin-1") + "/", status_code=308)


def ui_router() -> Router:
    return create_static_files_router(
        path="/ui", directories=[UI_DIRECTORY], html_mode=True, name="ui", before_request=_slash,
        after_request=_secure, cache_control=CacheControlHeader(no_cache=True), include_in_schema=False,
    )
