"""A Responses request's tools over a chat-completions upstream (docs/behaviour.md#the-responses-api):

    function tool                     a chat function tool
    custom tool (free-form input)     a chat function tool taking one string, ``input`` (its format,
                                      a grammar, told in the description); the model's call comes
                                      back to the client as a ``custom_tool_call`` with that input
    namespace tool (its functions     chat function tools named ``<namespace>__<name>``: the model
      and custom tools)               calls them so, the client gets ``name`` and ``namespace`` back
    tool search the client runs       a chat function ``tool_search`` (its description and
      (``execution: "client"``)       parameters); the model's call comes back as a
                                      ``tool_search_call``, and the tools the client's
                                      ``tool_search_output`` items loaded into the conversation are
                                      offered with every later call (``LOADED``)
    hosted tool (web_search, ...)     nothing a chat upstream can run: dropped -- the call records
                                      which (``DROPPED``) and the answer says so -- or refused

Pure functions; the names a call offered are read from its own ``tools``, so a function whose own
name holds ``__`` is never split wrongly.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...errors import InvalidRequest
from ...surrogates import encode, loads
from .. import DROPPED_TOOLS

__all__ = ["DROPPED", "LOADED", "SEARCH", "chat_tools", "custom_arguments", "custom_input", "custom_names", "flat_name",
           "hosted", "is_search", "members", "namespace_of", "offered", "searches", "split_name"]

DROPPED = DROPPED_TOOLS  # in a node's params: the hosted tools its call offered and went without
# in the params a call is built and answered with (never stored: its history says them again):
# the tools a client-executed tool search loaded earlier in the conversation
LOADED = "_bp_loaded_tools"
SEARCH = "tool_search"  # the chat function standing for a tool search the client runs
_SEPARATOR = "__"
_CALLABLE = frozenset({"function", "custom"})  # the tools a chat upstream's model can call (the client runs them)
_INPUT = "input"  # a custom tool's one argument over chat



def members(tool: dict[str, Any]) -> list[Any]:
    """A namespace tool's members (none when its ``tools`` is not a list)."""
    inner = tool.get("tools")
    return inner if isinstance(inner, list) else []


def offered(params: dict[str, Any]) -> list[Any]:
    """The tools a call offers the model: its own, then those a tool search loaded before."""
    own = params.get("tools")
    own = own if isinstance(own, list) else []
    loaded = params.get(LOADED)
    return [*own, *loaded] if loaded else own


def _client_search(tool: Any) -> bool:
    return isinstance(tool, dict) and tool.get("type") == SEARCH and tool.get("execution") == "client"


def searches(tools: Any) -> bool:
    """Whether ``tools`` offer a tool search the client runs."""
    return isinstance(tools, list) and any(_client_search(t) for t in tools)


def is_search(name: Any, tools: Any) -> bool:
    """Whether a chat function ``name`` the model called is the client's tool search (offered as
    ``tool_search``, and no function of that name was offered besides)."""
    if name != SEARCH or not isinstance(tools, list):
        return False
    if any(isinstance(t, dict) and t.get("type") in _CALLABLE and t.get("name") == SEARCH for t in tools):
        return False
    return searches(tools)


def flat_name(namespace: Any, name: Any) -> Any:
    """The chat function name of function ``name`` in ``namespace`` (none: the name itself)."""
    return f"{namespace}{_SEPARATOR}{name}" if isinstance(namespace, str) and namespace else name


def _namespaced(tools: Any) -> dict[str, tuple[str, str]]:
    table: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for fn in members(tool):
                if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                    table[flat_name(tool["name"], fn["name"])] = (tool["name"], fn["name"])
    return table


def custom_names(tools: Any) -> frozenset[str]:
    """The chat function names of a call's custom tools (namespaced ones by their flat name)."""
    names = set()
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            names.add(tool["name"])
        elif tool.get("type") == "namespace":
            names.update(flat_name(tool.get("name"), fn["name"]) for fn in members(tool)
                         if isinstance(fn, dict) and fn.get("type") == "custom" and isinstance(fn.get("name"), str))
    return frozenset(names)


def custom_arguments(text: Any) -> str:
    """A custom tool call's input as the arguments of the chat function call standing for it."""
    return encode({_INPUT: text if isinstance(text, str) else ""}).decode()  # (a streamed input's lone surrogate too)


def custom_input(arguments: Any) -> str:
    """The input of a custom tool call from the arguments the model gave its chat function: the
    ``input`` string -- or, from a model that did not keep to the one argument, the arguments as
    they came (the client's tool reports what it cannot read)."""
    if not isinstance(arguments, str):
        return ""
    try:
        value = loads(arguments)
    except msgspec.DecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(_INPUT), str):
        return value[_INPUT]
    return value if isinstance(value, str) else arguments  # (a bare JSON string: its text)


def split_name(name: Any, tools: Any) -> tuple[str | None, Any]:
    """(namespace, name) of a chat function name the model called, by the call's own ``tools``."""
    found = _namespaced(tools).get(name) if isinstance(name, str) and _SEPARATOR in name else None
    return found if found is not None else (None, name)


def namespace_of(name: Any, tools: Any) -> str | None:
    """The namespace of the function ``name`` when no top-level function has that name and exactly
    one namespace holds it (a ``tool_choice`` naming a grouped function by its own name); else None."""
    if not isinstance(name, str):
        return None
    holders: dict[str, None] = {}  # (one namespace offered and loaded again holds it once)
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("type") in _CALLABLE and tool.get("name") == name:
            return None
        if tool.get("type") == "namespace" and isinstance(tool.get("name"), str) and any(
                isinstance(fn, dict) and fn.get("name") == name for fn in members(tool)):
            holders[tool["name"]] = None
    return next(iter(holders)) if len(holders) == 1 else None


def hosted(tools: Any) -> list[str]:
    """The types of the tools a chat upstream cannot run (anything but functions, custom tools and
    namespaces of them), in the order offered, once each."""
    kinds: dict[str, None] = {}
    for tool in tools if isinstance(tools, list) else ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":  # its members that are not functions (custom tools) neither
            for member in members(tool):
                inner = member.get("type", "function") if isinstance(member, dict) else None
                if inner not in _CALLABLE:
                    kinds[f"namespace:{inner}"] = None
        elif kind not in _CALLABLE and not _client_search(tool):
            kinds[str(kind)] = None
    return list(kinds)


def _function(tool: dict[str, Any], name: Any = None) -> dict[str, Any]:
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    if name is not None:
        function["name"] = name
    return {"type": "function", "function": function}


def _custom(tool: dict[str, Any], name: Any = None) -> dict[str, Any]:
    """The chat function standing for a custom tool: its input is one string, whose format (a
    grammar, which a chat upstream cannot enforce) the description tells the model."""
    said = [str(tool["description"])] if tool.get("description") else []
    said.append(f"Call this tool with one argument, `{_INPUT}`: its whole input as plain text, exactly as the "
                "tool takes it (the text itself inside that one string, nothing wrapped around it).")
    fmt = tool.get("format") if isinstance(tool.get("format"), dict) else {}
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        said.append(f"The input must follow this {fmt.get('syntax') or 'grammar'} grammar:\n{fmt['definition']}")
    parameters = {"type": "object", "properties": {_INPUT: {"type": "string"}}, "required": [_INPUT],
                  "additionalProperties": False}
    return {"type": "function", "function": {"name": name if name is not None else tool.get("name"),
                                             "description": "\n\n".join(said), "parameters": parameters}}


def _search(tool: dict[str, Any]) -> dict[str, Any]:
    """The chat function standing for a tool search the client runs."""
    parameters = tool.get("parameters")
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    function = {"name": SEARCH, "parameters": parameters}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def chat_tools(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat function tools for a Responses request's ``tools`` and those a tool search loaded
    (``offered``); a hosted tool among its own is left out when the call recorded it as dropped,
    and refused otherwise (a loaded one is left out: the client never offered it to this call)."""
    dropped = set(params.get(DROPPED) or ())
    own = params.get("tools") if isinstance(params.get("tools"), list) else []
    out: list[dict[str, Any]] = []
    seen: set[Any] = set()  # (a tool loaded twice, or loaded and offered, is offered once: its first definition)

    def add(tool: dict[str, Any]) -> None:
        if tool["function"].get("name") not in seen:
            seen.add(tool["function"].get("name"))
            out.append(tool)

    for n, tool in enumerate(offered(params)):
        loaded = n >= len(own)
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind == "function":
            add(_function(tool))
        elif kind == "custom":
            add(_custom(tool))
        elif _client_search(tool):
            add(_search(tool))
        elif kind == "namespace":
            for fn in members(tool):
                inner = fn.get("type", "function") if isinstance(fn, dict) else None
                if inner == "function":
                    add(_function(fn, flat_name(tool.get("name"), fn.get("name"))))
                elif inner == "custom":
                    add(_custom(fn, flat_name(tool.get("name"), fn.get("name"))))
                elif f"namespace:{inner}" not in dropped and not loaded:
                    raise InvalidRequest(f"tool type {inner!r} inside namespace {tool.get('name')!r} needs an upstream "
                                         "that speaks the Responses API (api = \"responses\")", param="tools")
        elif kind not in dropped and not loaded:
            raise InvalidRequest(f"tool type {kind!r} needs an upstream that speaks the Responses API "
                                 "(api = \"responses\"); this model's upstream speaks chat completions", param="tools")
    return out
