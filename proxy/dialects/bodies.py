"""A client's request body read (chat completions, Responses, Messages): a JSON object naming a
model, every field kept, none with the proxy's own prefix; its numbers read as they will read back
once stored (``_as_stored``)."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from ..errors import InvalidRequest
from ..surrogates import loads

__all__ = ["OWN", "parse_model_request", "refuse_own_keys"]

OWN = "_bp_"  # (assembly.NATIVE: the prefix of the proxy's own keys in stored items and params)


def _as_stored(text: str) -> float | int:
    """A number of a request as it reads back once stored (PostgreSQL's jsonb keeps numbers as
    ``numeric``): an integral one of 1e16 or more -- which JSON writers give in exponent form --
    an integer, and -0.0 plain 0.0. So the first call's request and every later one, rebuilt from
    what was stored, say the same bytes (a provider's prompt cache, the request's replay check)."""
    value = float(text)
    if value != value or value in (math.inf, -math.inf):
        raise ValueError("not a finite number")
    if value == 0.0:
        return 0.0
    if abs(value) >= 1e16 and value.is_integer():
        return int(value)
    return value


_read_request = msgspec.json.Decoder(float_hook=_as_stored).decode


def parse_model_request(raw: bytes) -> dict[str, Any]:
    """A call's body (chat completions, Responses, Messages) as a dict, every field kept: a JSON
    object naming a model; anything else is refused with 400. Its numbers read as stored ones
    will (``_as_stored``)."""
    try:
        body = loads(raw, _read_request)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model or "\x00" in model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    for key in body:
        if key.startswith(OWN):  # the proxy's own keys in what it stores: never a client's
            raise InvalidRequest(f"{key!r} is not a request field (the prefix {OWN} is Branchpoint's own)", param=key)
    return body


def refuse_own_keys(item: Any, where: str) -> None:
    """Refuse an item (a message) of a client's that carries one of the proxy's own keys."""
    if isinstance(item, dict):
        for key in item:
            if type(key) is str and key.startswith(OWN):
                raise InvalidRequest(f"{where}: {key!r} is not a message field (the prefix {OWN} is Branchpoint's own)",
                                     param=where)
