"""What the libraries on a stored call's path cost by themselves, in process, one request at a time
(no network, no database): the share of the proxy's CPU per call that is not its own code.

    uv run python bench/framework.py [--requests 20000] [--rounds 3]

- Litestar: a POST routed to a handler shaped as the proxy's call routes are (the request, one
  named dependency built from another, the body read, an ASGI app returned -- proxy/routes/chat.py)
  against the same handler with no dependency, and against a bare ASGI app doing the same (read
  the body, answer): what routing, dependency injection and the handler's machinery cost.
- httpx: a call's upstream request as ``UpstreamClient.build`` makes it (``httpx.Request`` with a
  bytes body and a parsed URL) against the same request made from its parts (``stream=``): what
  httpx's general path costs.

Figures are microseconds per request, the median of the rounds. Compare them with the proxy's CPU
per stored call (bench/versus.py, bench/ab.py) to see what removing a layer could at most save.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from litestar import Litestar, Request, post
from litestar.di import NamedDependency, Provide
from litestar.types import ASGIApp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import arguments, log, write_result

_HEADERS = [(b"host", b"127.0.0.1:14090"), (b"content-type", b"application/json"), (b"accept", b"application/json"),
            (b"user-agent", b"OpenAI/Python 1.99.0"), (b"authorization", b"Bearer sk-bench"),
            (b"x-conversation-id", b"bench-00"), (b"content-length", b"200")]
_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 150 + b'"}]}'


async def _answer(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


class _Context:
    __slots__ = ("caller",)

    def __init__(self, caller: str | None) -> None:
        self.caller = caller


@post("/v1/chat/completions", status_code=200)
async def _with_dependency(request: Request[Any, Any, Any], call: NamedDependency[_Context]) -> ASGIApp:
    await request.body()
    return _answer


@post("/v1/chat/completions", status_code=200)
async def _without(request: Request[Any, Any, Any]) -> ASGIApp:
    await request.body()
    return _answer


def _caller(request: Request[Any, Any, Any]) -> str | None:
    return request.headers.get("authorization")


def _context(caller: NamedDependency[str]) -> _Context:
    return _Context(caller)


async def _bare(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await _answer(scope, receive, send)


async def _per_request(app: Any, n: int) -> float:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": _BODY, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    start = time.perf_counter()
    for _ in range(n):
        await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                   "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                   "query_string": b"", "headers": _HEADERS, "client": ("127.0.0.1", 1),
                   "server": ("127.0.0.1", 2), "root_path": "", "state": {}}, receive, send)
    elapsed = (time.perf_counter() - start) / n * 1e6
    if sent[0]["status"] != 200:
        raise SystemExit(f"the app answered {sent[0]}")
    return elapsed


def _httpx(n: int) -> tuple[float, float]:
    url = httpx.URL("http://127.0.0.1:18090/v1/chat/completions")
    headers = [(k, v) for k, v in _HEADERS if k not in (b"host", b"content-length")]
    start = time.perf_counter()
    for _ in range(n):
        httpx.Request("POST", url, headers=headers, content=_BODY, extensions={"timeout": 1.0})
    general = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for _ in range(n):
        httpx.Request("POST", url, headers=[(b"Host", url.netloc), *headers, (b"Content-Length", b"%d" % len(_BODY))],
                      stream=httpx.ByteStream(_BODY), extensions={"timeout": 1.0})
    direct = (time.perf_counter() - start) / n * 1e6
    return general, direct


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dependencies = {"caller": Provide(_caller, sync_to_thread=False), "call": Provide(_context, sync_to_thread=False)}
    apps = {"litestar, one dependency": Litestar([_with_dependency], dependencies=dependencies, logging_config=None,
                                                 openapi_config=None),
            "litestar, no dependency": Litestar([_without], logging_config=None, openapi_config=None),
            "bare ASGI": _bare}
    rows: dict[str, list[float]] = {name: [] for name in [*apps, "httpx.Request(content=)", "httpx.Request(stream=)"]}
    for r in range(args.rounds):
        for name, app in apps.items():
            rows[name].append(asyncio.run(_per_request(app, args.requests)))
        general, direct = _httpx(args.requests)
        rows["httpx.Request(content=)"].append(general)
        rows["httpx.Request(stream=)"].append(direct)
        log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} us" for k, v in rows.items()))
    figures = {name: {"us_per_request": round(statistics.median(v), 1), "rounds": [round(x, 1) for x in v]}
               for name, v in rows.items()}
    write_result(figures, out=args.out)
    print("| what | us per request (median) |\n|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {f['us_per_request']} |")


if __name__ == "__main__":
    main()
