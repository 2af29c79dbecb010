"""A Responses request's tools over a chat-completions upstream (docs/behaviour.md#the-responses-api):

    function tool                     a chat function tool
    namespace tool (its functions)    chat function tools named ``<namespace>__<name>``: the model
                                      calls them so, the client gets ``name`` and ``namespace`` back
    hosted tool (web_search, ...)     nothing a chat upstream can run: dropped -- the call records
                                      which (``DROPPED``) and the answer says so -- or refused

Pure functions; the names a call offered are read from its own ``tools``, so a function whose own
name holds ``__`` is never split wrongly.
"""

from __future__ import annotations

from typing import Any

from ...errors import InvalidRequest

__all__ = ["DROPPED", "chat_tools", "flat_name", "hosted", "namespace_of", "split_name"]

DROPPED = "_bp_dropped_tools"  # in a node's params: the hosted tools its call offered and went without
_SEPARATOR = "__"


def flat_name(namespace: Any, name: Any) -> Any:
    """The chat function name of function ``name`` in ``namespace`` (none: the name itself)."""
    return f"{namespace}{_SEPARATOR}{name}" if isinstance(namespace, str) and namespace else name


def _namespaced(tools: Any) -> dict[str, tuple[str, str]]:
    table: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for fn in tool.get("tools") or ():
                if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                    table[flat_name(tool["name"], fn["name"])] = (tool["name"], fn["name"])
    return table


def split_name(name: Any, tools: Any) -> tuple[str | None, Any]:
    """(namespace, name) of a chat function name the model called, by the call's own ``tools``."""
    found = _namespaced(tools).get(name) if isinstance(name, str) and _SEPARATOR in name else None
    return found if found is not None else (None, name)


def namespace_of(name: Any, tools: Any) -> str | None:
    """The namespace of the function ``name`` when no top-level function has that name and exactly
    one namespace holds it (a ``tool_choice`` naming a grouped function by its own name); else None."""
    if not isinstance(name, str):
        return None
    holders = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "function" and tool.get("name") == name:
            return None
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str) and any(
                isinstance(fn, dict) and fn.get("name") == name for fn in tool.get("tools") or ()):
            holders.append(tool["name"])
    return holders[0] if len(holders) == 1 else None


def hosted(tools: Any) -> list[str]:
    """The types of the tools a chat upstream cannot run (anything but functions and namespaces of
    functions), in the order offered, once each."""
    kinds: dict[str, None] = {}
    for tool in tools if isinstance(tools, list) else ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":  # its members that are not functions (custom tools) neither
            for member in tool.get("tools") or ():
                inner = member.get("type", "function") if isinstance(member, dict) else None
                if inner != "function":
                    kinds[f"namespace:{inner}"] = None
        elif kind != "function":
            kinds[str(kind)] = None
    return list(kinds)


def _function(tool: dict[str, Any], name: Any = None) -> dict[str, Any]:
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    if name is not None:
        function["name"] = name
    return {"type": "function", "function": function}


def chat_tools(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat function tools for a Responses request's ``tools``; a hosted tool is left out when
    the call recorded it as dropped, and refused otherwise."""
    dropped = set(params.get(DROPPED) or ())
    out = []
    for tool in params.get("tools") or ():
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind == "function":
            out.append(_function(tool))
        elif kind == "namespace":
            for fn in tool.get("tools") or ():
                inner = fn.get("type", "function") if isinstance(fn, dict) else None
                if inner == "function":
                    out.append(_function(fn, flat_name(tool.get("name"), fn.get("name"))))
                elif f"namespace:{inner}" not in dropped:
                    raise InvalidRequest(f"tool type {inner!r} inside namespace {tool.get('name')!r} needs an upstream "
                                         "that speaks the Responses API (api = \"responses\")", param="tools")
        elif kind not in dropped:
            raise InvalidRequest(f"tool type {kind!r} needs an upstream that speaks the Responses API "
                                 "(api = \"responses\"); this model's upstream speaks chat completions", param="tools")
    return out
