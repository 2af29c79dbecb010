"""One walk over a JSON value, for the places that rewrite its strings: NULs marked before
PostgreSQL stores them (``storage.database``), lone UTF-16 surrogates mended (``proxy.surrogates``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["rebuilt"]


def rebuilt(value: Any, text: Callable[[str], str], *, keys: bool = False,
            whole: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """``value`` (JSON as decoded: strings, lists, dicts, scalars) with ``text`` applied to every
    string -- and to every object's keys, with ``keys`` -- as a new value; an object for which
    ``whole`` returns something other than None is replaced by that, whole. Walked with a stack of
    its own, not by recursion: a value nested hundreds of levels deep (an upstream's answer holds
    what the upstream likes) is rebuilt like any other."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict) and whole is not None and (instead := whole(value)) is not None:
        return instead
    if not isinstance(value, (list, dict)):
        return value
    root: Any = [] if isinstance(value, list) else {}
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, copy = stack.pop()
        items = enumerate(source) if isinstance(source, list) else source.items()
        for k, v in items:
            if isinstance(v, str):
                v = text(v)
            elif isinstance(v, dict) and whole is not None and (instead := whole(v)) is not None:
                v = instead
            elif isinstance(v, (list, dict)):
                new: Any = [] if isinstance(v, list) else {}
                stack.append((v, new))
                v = new
            if isinstance(copy, list):
                copy.append(v)
            else:
                copy[text(k) if keys and isinstance(k, str) else k] = v
    return root
