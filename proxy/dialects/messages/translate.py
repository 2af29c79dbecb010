"""Messages requests in chat terms, both ways (docs/behaviour.md#the-messages-api).
Pure functions.

    Messages request field              chat field
    max_tokens                          max_tokens
    stop_sequences                      stop
    tools (custom: input_schema,        tools (function: parameters, strict -- not where chat's
      strict)                             strict mode refuses the schema)
    tools (Anthropic's own: web_search, dropped, named in X-Branchpoint-Dropped-Tools
      bash_2025..., code_execution ...) (or refused: server.unsupported_tools)
    mcp_servers                         dropped, each named mcp:<name>, as Anthropic's own tools
    tool_choice auto / any / tool /     "auto" / "required" / a function / "none";
      none, disable_parallel_tool_use   parallel_tool_calls: false
    metadata.user_id                    user
    output_config.format (json_schema)  response_format (json_schema; strict where chat's strict
      (or the beta's output_format)       mode can hold the schema, as Anthropic's always holds to it)
    output_config.effort                reasoning_effort (the same values)
    temperature, top_p, stream          the same
    thinking, top_k, context_management, dropped: no chat equivalent (the answer does not
      service_tier, container ...       depend on them in a way chat can express)

    And a chat request for an Anthropic upstream (``request_fields``): the same the other way, and
    response_format json_schema         output_config.format (the schema as Anthropic's structured
                                          outputs take it: schema.py); json_object is refused

Answers, both ways: proxy/dialects/messages/answers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import InvalidRequest
from .schema import output_schema

__all__ = ["APPLIED_EDITS", "chat_params", "check_fields", "hosted", "mcp_servers", "request_fields", "untaken"]


# exchange params: the context edits the request asked for, as carried out (proxy.call sets them)
APPLIED_EDITS = "_bp_applied_edits"

_SAME = ("model", "temperature", "top_p", "stream")
DEFAULT_MAX_TOKENS = 4096  # a chat request that names no maximum (Anthropic requires one)


def _custom(tool: Any) -> bool:
    """A tool the client defines (a name and an input schema), as opposed to one of Anthropic's
    own (``{"type": "web_search_20250305", ...}``) that only an Anthropic upstream runs."""
    return isinstance(tool, dict) and tool.get("type") in (None, "custom") and "input_schema" in tool


def hosted(tools: Any) -> list[str]:
    """The tools a chat upstream cannot run: Anthropic's own, by type (or name)."""
    if not isinstance(tools, list):
        return []
    return [str(t.get("type") or t.get("name")) for t in tools if isinstance(t, dict) and not _custom(t)]


def mcp_servers(servers: Any) -> list[str]:
    """The MCP connector's servers (``mcp_servers``), which only Anthropic reaches: each a hosted
    tool a chat upstream goes without, named ``mcp:<its name>``."""
    if not isinstance(servers, list):
        return []
    return [f"mcp:{s.get('name')}" if isinstance(s, dict) and isinstance(s.get("name"), str) else "mcp"
            for s in servers]


def _chat_tool_choice(choice: Any, left_out: set[Any]) -> Any:
    """``left_out``: the names of the tools the call offered and a chat upstream goes without (its
    hosted ones, dropped): one of them forced is no choice there ("auto")."""
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "any":
        return "required"
    if kind == "tool":
        if choice.get("name") in left_out:
            return "auto"
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "none":
        return "none"
    return "auto"


# a Messages request's fields under the chat names ``chat_params`` gives them (their own elsewhere)
CHAT_FIELDS = {"stop": "stop_sequences", "user": "metadata.user_id",
               "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
               "response_format": "output_config.format", "reasoning_effort": "output_config.effort"}


def _response_format(params: dict[str, Any]) -> dict[str, Any] | None:
    """Structured output (``output_config.format``, or the structured-outputs beta's
    ``output_format``: a JSON schema) as chat's ``response_format``; strict where chat's strict mode
    can hold the schema (``_strict_fits``), since Anthropic's answer always holds to it. Chat's
    schema needs a name, which Anthropic's has not."""
    config = params.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        fmt = params.get("output_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        return None
    return {"type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"], "strict": _strict_fits(fmt["schema"])}}


def _strict_fits(schema: Any, depth: int = 0) -> bool:
    """Can chat's strict mode hold this schema? OpenAI's refuses one with an object that leaves a
    property out of ``required`` or does not close itself (``additionalProperties: false``) --
    which Anthropic's takes (Pydantic's defaults): such a schema goes as a non-strict one, a guide
    rather than a refusal."""
    if depth > 64:
        return False
    if isinstance(schema, list):
        return all(_strict_fits(s, depth + 1) for s in schema)
    if not isinstance(schema, dict):
        return True
    properties = schema.get("properties")
    if isinstance(properties, dict) or schema.get("type") == "object":
        required = schema.get("required", [])
        if schema.get("additionalProperties") is not False or not isinstance(required, list) \
                or set(properties or ()) - {r for r in required if isinstance(r, str)}:
            return False
    if isinstance(properties, dict) and not all(_strict_fits(v, depth + 1) for v in properties.values()):
        return False
    return all(_strict_fits(v, depth + 1) for k, v in schema.items()
               if k not in ("properties", "required", "enum", "const", "default", "examples"))


def _chat_function(tool: dict[str, Any]) -> dict[str, Any]:
    """A custom tool as chat's function: ``strict`` as the tool says it -- but for a schema chat's
    strict mode refuses (``_strict_fits``), which goes as a non-strict one, a guide rather than a
    refusal; a tool that does not say it is not strict, in either API."""
    out = {k: v for k, v in (("name", tool.get("name")), ("description", tool.get("description")),
                             ("parameters", tool.get("input_schema"))) if v is not None}
    if isinstance(tool.get("strict"), bool):
        out["strict"] = tool["strict"] and _strict_fits(tool.get("input_schema"))
    return out


def chat_params(params: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions fields for a Messages request's other fields."""
    out = {k: params[k] for k in _SAME if k in params}
    if params.get("max_tokens") is not None:
        out["max_tokens"] = params["max_tokens"]
    stop = params.get("stop_sequences")
    if isinstance(stop, list) and stop:
        out["stop"] = stop
    tools = [t for t in params.get("tools") or () if _custom(t)]
    if tools:
        out["tools"] = [{"type": "function", "function": _chat_function(t)} for t in tools]
        choice = params.get("tool_choice")
        left_out = {t.get("name") for t in params.get("tools") or () if isinstance(t, dict) and not _custom(t)}
        mapped = _chat_tool_choice(choice, left_out)
        if mapped is not None:
            out["tool_choice"] = mapped
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    metadata = params.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        out["user"] = metadata["user_id"]
    fmt = _response_format(params)
    if fmt is not None:
        out["response_format"] = fmt
    config = params.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("effort"), str):
        out["reasoning_effort"] = config["effort"]  # (low ... max: chat's values too; another goes as it came)
    return out


# -- chat requests for an Anthropic upstream --------------------------------------------------------

# (OpenAI's own among them -- its prompt cache's key and options, safety_identifier: Anthropic
# refuses a field it does not know, 400 "Extra inputs are not permitted", so a chat SDK call that
# set one failed on every Claude model; any other field goes as it came)
_DROPPED_FROM_CHAT = frozenset({"stream_options", "seed", "store", "messages", "n", "user", "max_completion_tokens",
                                "parallel_tool_calls", "reasoning_effort", "verbosity", "metadata", "prompt_cache_key",
                                "prompt_cache_options", "prompt_cache_retention", "safety_identifier"})
# OpenAI's service tiers, which are not Anthropic's ("auto", "standard_only"): not sent
_OPENAI_TIERS = frozenset({"default", "flex", "scale", "priority", "fast"})
# chat fields with no Messages equivalent: refused unless they hold the value that changes nothing
_REFUSED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "logit_bias": (None, {}), "logprobs": (None, False), "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "functions": (None, []), "function_call": (None,),
    "web_search_options": (None,), "moderation": (None,),
}
_TEXT = (None, {"type": "text"})  # (a response_format that asks for nothing: not sent)


def _json_schema(fmt: Any) -> dict[str, Any] | None:
    """The schema of a ``response_format`` asking for JSON that holds to one (``json_schema``),
    else None."""
    spec = fmt.get("json_schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return schema if isinstance(schema, dict) else None


def check_fields(params: dict[str, Any], name: Callable[[str], str] = str) -> None:
    """Raise ``InvalidRequest`` for a chat field the Messages API cannot honour, under the name the
    client gave it (``name``, as ``responses.for_chat.check_fields``)."""
    for field, harmless in _REFUSED.items():
        if field in params and params[field] not in harmless:
            raise InvalidRequest(f"{name(field)!r} has no equivalent in the Messages API, which this model's upstream "
                                 "speaks (api = \"anthropic\")", param=name(field))
    fmt = params.get("response_format")
    if fmt not in _TEXT and _json_schema(fmt) is None:  # (json_object: JSON without a schema)
        what, also = repr(name("response_format")), ""
        if isinstance(fmt, dict):
            kind = fmt.get("type")
            what += f" of type {kind!r}" + (" without a schema" if kind == "json_schema" else "")
            also = "; one of type 'json_schema' with a schema has (Anthropic's structured outputs)"
        raise InvalidRequest(f"{what} has no equivalent in the Messages API, which this model's upstream "
                             f"speaks (api = \"anthropic\"){also}", param=name("response_format"))


def untaken(tools: Any) -> list[str]:
    """The types of a chat request's tools an Anthropic upstream cannot take: custom ones
    (free-form input), dropped and named in X-Branchpoint-Dropped-Tools (or refused:
    server.unsupported_tools) -- never left out unsaid."""
    if not isinstance(tools, list):
        return []
    return ["custom"] if any(isinstance(t, dict) and t.get("type") == "custom" for t in tools) else []


def _allowed(choice: Any) -> set[Any] | None:
    """The names of the functions a ``tool_choice`` of ``allowed_tools`` leaves the model (None:
    it is no such choice)."""
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return None
    allowed = choice.get("allowed_tools") if isinstance(choice.get("allowed_tools"), dict) else {}
    return {t["function"].get("name") for t in allowed.get("tools") or ()
            if isinstance(t, dict) and isinstance(t.get("function"), dict)}


def _anthropic_tool_choice(choice: Any, parallel: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":  # (its tools: offered alone)
        allowed = choice.get("allowed_tools") if isinstance(choice.get("allowed_tools"), dict) else {}
        choice = allowed.get("mode", "auto")
    if choice == "required":
        out: dict[str, Any] = {"type": "any"}
    elif choice == "none":
        out = {"type": "none"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name")}
    elif choice in (None, "auto") and parallel is False:
        out = {"type": "auto"}
    elif choice in (None,):
        return None
    else:
        out = {"type": "auto"}
    if parallel is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def request_fields(params: dict[str, Any]) -> dict[str, Any]:
    """The Messages request fields (all but ``system`` and ``messages``) for a chat request's other
    fields, which ``check_fields`` has passed; unknown fields are forwarded as they are."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in _DROPPED_FROM_CHAT or key in _REFUSED or key.startswith("_bp_"):
            continue
        if key == "max_tokens" or (key == "service_tier" and isinstance(value, str) and value in _OPENAI_TIERS):
            continue
        if key == "stop":
            if value:
                out["stop_sequences"] = [value] if isinstance(value, str) else list(value)
        elif key == "tools":
            tools = []
            allowed = _allowed(params.get("tool_choice"))
            for t in value or ():
                fn = t.get("function") if isinstance(t, dict) else None
                if isinstance(fn, dict) and (allowed is None or fn.get("name") in allowed):
                    tool = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object"}}
                    if fn.get("description"):
                        tool["description"] = fn["description"]
                    # (a function's strict is not sent: Anthropic refuses strict tools on a model
                    # without structured outputs, and compiles a grammar per strict tool -- OpenAI's
                    # clients send strict: true on every tool by default, the Agents SDK among them,
                    # and would be refused where the tool worked as a guide: docs/behaviour.md)
                    tools.append(tool)
            if tools:
                out["tools"] = tools
        elif key in ("tool_choice", "response_format"):
            pass  # (below: with parallel_tool_calls; as output_config.format)
        else:
            out[key] = value
    schema = _json_schema(params.get("response_format"))
    if schema is not None:  # (structured outputs: JSON holding to the schema, as the answer's text)
        config = out.get("output_config")
        out["output_config"] = {**(config if isinstance(config, dict) else {}),
                                "format": {"type": "json_schema", "schema": output_schema(schema)}}
    maximum = params.get("max_completion_tokens") or params.get("max_tokens")
    out["max_tokens"] = maximum if isinstance(maximum, int) and maximum > 0 else DEFAULT_MAX_TOKENS
    if "tools" in out:
        choice = _anthropic_tool_choice(params.get("tool_choice"), params.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    if isinstance(params.get("user"), str):
        out["metadata"] = {"user_id": params["user"]}
    return out


# -- answers --------------------------------------------------------------------------------------
