"""The Responses API over a chat-completions upstream, and the Responses objects the proxy serves
(docs/behaviour.md#the-responses-api). Pure functions.

- ``chat_params``: a Responses request's other fields as chat-completions fields (function tools,
  ``tool_choice``, ``text.format`` -> ``response_format``, ``max_output_tokens``, reasoning effort);
- ``native_params``: the same request for a Responses upstream (``store: false``, no
  ``previous_response_id``: the proxy owns the state);
- ``output_items``: a chat answer as output items, with ids derived from the node id;
- ``response_object``: the response a client gets (and ``GET /v1/responses/{id}`` serves);
- ``usage``: chat usage in Responses terms.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from ...assembly import NATIVE
from ...errors import InvalidRequest
from ...key_order import KEY_ORDER
from ...surrogates import loads
from .. import CACHE_WRITES, signed, usage_count
from ..chat.completion import call_id
from .tools import (
    DROPPED,
    SEARCH,
    chat_tools,
    custom_input,
    custom_names,
    flat_name,
    is_search,
    namespace_of,
    offered,
    split_name,
)

__all__ = ["chat_params", "chat_usage_of", "finish_of", "input_item_id", "item_id_prefix", "native_params", "output_items", "response_object",
           "usage_of"]


# Responses fields with a chat-completions equivalent of the same name and meaning.
_SAME = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "service_tier", "prompt_cache_key",
         "safety_identifier", "top_logprobs", "stream")
# Fields only the proxy uses (or a Responses upstream must not get). ``background``: the proxy
# answers every call as it runs (over any upstream): an upstream's queued response would be an
# answer still to come that nothing here ever fetches.
_OURS = ("input", "instructions", "previous_response_id", "store", "conversation", "context_management", "truncation",
         "background")


def _tool_choice(choice: Any, dropped: Any, tools: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        namespace = choice.get("namespace")
        if namespace is None:  # a function named without its namespace: the one namespace holding it
            namespace = namespace_of(choice.get("name"), tools)
        return {"type": "function", "function": {"name": flat_name(namespace, choice.get("name"))}}
    if isinstance(choice, dict) and choice.get("type") in (dropped or ()):
        return "auto"  # (a hosted tool the call went without)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return choice.get("mode", "auto")
    return choice


def _allowed(chat: list[dict[str, Any]], choice: Any, tools: Any) -> list[dict[str, Any]]:
    """The chat tools a ``tool_choice`` of ``allowed_tools`` leaves the model: only those it names
    (chat servers other than OpenAI's have no such choice, and the mode alone -- "auto" or
    "required" -- would let the model call a tool the client excluded)."""
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return chat
    names = set()
    for tool in choice.get("tools") or ():
        if isinstance(tool, dict) and tool.get("type", "function") in ("function", "custom"):
            namespace = tool.get("namespace") or namespace_of(tool.get("name"), tools)
            names.add(flat_name(namespace, tool.get("name")))
        elif isinstance(tool, dict) and tool.get("type") == SEARCH:  # (the client's search, offered as a function)
            names.add(SEARCH)
    return [t for t in chat if t["function"].get("name") in names]


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


# a Responses request's fields under the chat names ``chat_params`` gives them (their own elsewhere)
CHAT_FIELDS = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format",
               "reasoning_effort": "reasoning.effort", "verbosity": "text.verbosity"}


# includes that would change the answer and that a translation through chat cannot serve: the
# output's logprobs, which it does not carry back (any other -- what the answer holds anyway, or a
# dropped hosted tool's output, or one named after this was written -- passes, as fields do)
_UNSERVABLE_INCLUDES = frozenset({"message.output_text.logprobs"})


def check_to_chat(params: dict[str, Any]) -> None:
    """Raise ``InvalidRequest`` for a Responses field that changes the answer and that the
    translation through chat cannot carry -- a reusable prompt, the output's logprobs -- rather than
    drop it: the model would answer without it, and the client never know."""
    if params.get("prompt") is not None:
        raise InvalidRequest("'prompt' (a reusable prompt) needs an upstream that speaks the Responses API; this "
                             "model's upstream does not: send its instructions and input instead", param="prompt")
    include = params.get("include")
    for value in include if isinstance(include, list) else ():
        if value in _UNSERVABLE_INCLUDES:
            raise InvalidRequest(f"include {value!r} needs an upstream that speaks the Responses API; this model's "
                                 "upstream does not", param="include")
    if params.get("top_logprobs") not in (None, 0):
        raise InvalidRequest("'top_logprobs' needs an upstream that speaks the Responses API; this model's upstream "
                             "does not", param="top_logprobs")


def chat_params(params: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions fields for a Responses request's other fields."""
    out = {k: params[k] for k in _SAME if k in params}
    if params.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = params["max_output_tokens"]
    if params.get("tools"):
        tools = _allowed(chat_tools(params), params.get("tool_choice"), offered(params))
        if tools:
            out["tools"] = tools
    if params.get("tool_choice") is not None and ("tools" in out or not params.get("tools")):  # (all dropped: none)
        out["tool_choice"] = _tool_choice(params["tool_choice"], params.get(DROPPED), offered(params))
    if "tools" not in out:  # (the Responses API takes it without tools; chat refuses it: "only allowed when tools")
        out.pop("parallel_tool_calls", None)
    if not out.get("top_logprobs"):  # (0 asks nothing; chat takes it only with logprobs, which a non-zero one is refused for)
        out.pop("top_logprobs", None)
    fmt = _response_format(params.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    reasoning = params.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        out["reasoning_effort"] = reasoning["effort"]
    text = params.get("text")
    if isinstance(text, dict) and text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]
    if isinstance(params.get("metadata"), dict) and params["metadata"]:
        out["metadata"] = params["metadata"]
    return out


def native_params(params: dict[str, Any]) -> dict[str, Any]:
    """The fields a Responses upstream gets: the client's own, but never stored upstream and never
    pointing at upstream state -- the proxy sends the whole assembled input every time."""
    out = {k: v for k, v in params.items() if k not in _OURS and (not k.startswith(NATIVE) or k == KEY_ORDER)}
    out["store"] = False
    return out


# how each API names the same counts: input, output, their details, and the detail kept of each
_CHAT_USAGE = ("prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details")
_RESPONSES_USAGE = ("input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details")


def convert_usage(usage: Any, source: tuple[str, ...], target: tuple[str, ...]) -> dict[str, Any] | None:
    """A usage object in the other API's names (``_CHAT_USAGE`` / ``_RESPONSES_USAGE``): the
    input and output counts, cached input and reasoning output tokens, the total."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage_count(usage.get(source[0])), usage_count(usage.get(source[1]))
    details_in, details_out = usage.get(source[2]), usage.get(source[3])
    cached = usage_count(details_in.get("cached_tokens")) if isinstance(details_in, dict) else 0
    reasoning = usage_count(details_out.get("reasoning_tokens")) if isinstance(details_out, dict) else 0
    out = {target[0]: prompt, target[2]: {"cached_tokens": cached},
           target[1]: completion, target[3]: {"reasoning_tokens": reasoning},
           "total_tokens": usage_count(usage.get("total_tokens")) or prompt + completion}
    if usage_count(usage.get(CACHE_WRITES)):  # (an Anthropic upstream's cache writes: neither API has a word for them)
        out[CACHE_WRITES] = usage[CACHE_WRITES]
    return out


def usage_of(chat_usage: Any) -> dict[str, Any] | None:
    """Chat-completions usage in Responses terms."""
    return convert_usage(chat_usage, _CHAT_USAGE, _RESPONSES_USAGE)


def chat_usage_of(usage: Any) -> dict[str, Any] | None:
    """Responses usage in chat-completions terms."""
    return convert_usage(usage, _RESPONSES_USAGE, _CHAT_USAGE)


def message_item_id(node_id: uuid.UUID) -> str:
    return f"msg_{node_id.hex}"


def output_item_id(node_id: uuid.UUID, index: int, kind: str) -> str:
    """The id of a node's ``index``-th output item, of type ``kind`` (``fc_<node>_<i>`` ...)."""
    return f"{item_id_prefix(kind)}_{node_id.hex}_{index}"


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
              "custom_tool_call": "ctc", "custom_tool_call_output": "ctco", "tool_search_call": "tsc",
              "tool_search_output": "tso"}


def gets_our_id(item: dict[str, Any]) -> bool:
    """Whether an upstream's output item is given an id of the node's (``<prefix>_<node>_<i>``):
    messages and the calls a client answers -- so a client sending them back is understood
    (``answered.call_of``) and may reference them (``item_reference``)."""
    kind = item.get("type")
    return kind in ("message", "function_call", "custom_tool_call") or (
        kind == "tool_search_call" and item.get("execution") == "client")


def item_id_prefix(kind: str) -> str:
    """What an item id made by the proxy begins with, by the item's type."""
    return _ID_PREFIX.get(kind, kind)


def input_item_id(kind: str, node_id: uuid.UUID, index: int) -> str:
    """The id of a call's ``index``-th input item that came without one (the Conversations API's
    items, a response's input items): the node's, marked as input (``_in``) -- never the id of one
    of its output items (``msg_<node>_<i>``, ``fc_<node>_<i>``), or deleting an answer would delete
    its question."""
    return f"{item_id_prefix(kind)}_{node_id.hex}_in{index}"


def output_items(message: dict[str, Any], node_id: uuid.UUID, tools: Any = None,
                 producer: str | None = None) -> list[dict[str, Any]]:
    """A chat answer (assistant message) as Responses output items; ``tools``: those the call
    offered (``tools.offered``), which say the namespace of a function the model called by its
    flat name, and which calls are of custom tools or the client's tool search; ``producer``: the
    provider that answered (what only it gets back is kept for it: ``kept_item``)."""
    out: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out.append({"id": f"rs_{node_id.hex}", "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": reasoning}]})
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(
        str(p.get("text") or "") for p in (content if isinstance(content, list) else ()) if isinstance(p, dict))
    if text or message.get("refusal") or not message.get("tool_calls"):
        parts: list[dict[str, Any]] = []
        if text or not message.get("refusal"):
            parts.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
        if message.get("refusal"):
            parts.append({"type": "refusal", "refusal": message["refusal"]})
        out.append({"id": message_item_id(node_id), "type": "message", "role": "assistant", "status": "completed",
                    "content": parts})
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else ()):
        if not isinstance(call, dict):
            continue  # (an upstream's odd answer: not a call)
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        out.append(tool_call_item(node_id, i, call_id(call, node_id, i), fn.get("name"), fn.get("arguments") or "",
                                 tools, status="completed"))
    carried = kept_item(message, node_id, producer)  # (a call's signature, signed reasoning: signed.py)
    if carried is not None:
        out.append(carried)
    return out


def kept_item(message: dict[str, Any], node_id: uuid.UUID, producer: str | None) -> dict[str, Any] | None:
    """The reasoning item keeping what of a chat answer no other item has a place for (a tool
    call's signature, signed or opaque reasoning: ``signed``), after the others; None when there
    is nothing."""
    carried = signed.blob(message, node_id, producer)
    if carried is None:
        return None
    return {"id": f"rs_{node_id.hex}_kept", "type": "reasoning", "summary": [], "encrypted_content": carried}


def tool_call_item(node_id: uuid.UUID, index: int, call_id: Any, name: Any, arguments: str, tools: Any, *,
                  status: str) -> dict[str, Any]:
    """The output item for a chat tool call, the node's ``index``-th: a ``function_call``, a
    ``custom_tool_call`` with its input when ``tools`` offered that name as a custom tool, or the
    client's ``tool_search_call`` (a function's namespace, if it has one, told apart)."""
    if is_search(name, tools):
        kind = "tool_search_call"
        try:
            parsed = loads(arguments) if arguments else {}
        except msgspec.DecodeError:
            parsed = arguments
        if not isinstance(parsed, dict):  # (a model that wrote its query bare: an object, as the item has it)
            parsed = {"query": parsed}
        return {"id": output_item_id(node_id, index, kind), "type": kind, "status": status, "call_id": call_id,
                "execution": "client", "arguments": parsed}
    custom = name in custom_names(tools)
    kind = "custom_tool_call" if custom else "function_call"
    namespace, plain = split_name(name, tools)
    item = {"id": output_item_id(node_id, index, kind), "type": kind, "status": status, "call_id": call_id, "name": plain}
    if custom:
        item["input"] = custom_input(arguments)
    else:
        item["arguments"] = arguments
    if namespace is not None:
        item["namespace"] = namespace
    return item


def conversation_of(params: dict[str, Any]) -> dict[str, str] | None:
    """The ``conversation`` a response object names: the one its request named (``"conv_…"`` or
    ``{"id": …}``), as ``{"id"}``; None when it named none."""
    conv = params.get("conversation")
    conv = conv.get("id") if isinstance(conv, dict) else conv
    return {"id": conv} if isinstance(conv, str) else None


def client_fields(params: dict[str, Any]) -> dict[str, Any]:
    """The fields of a response object that say the client's request, not the upstream's (which
    never saw them): restored on a Responses upstream's answer."""
    return {"previous_response_id": params.get("previous_response_id"), "store": params.get("store", True),
            "instructions": params.get("instructions"), "conversation": conversation_of(params),
            "background": params.get("background") is True}


# a finish reason (chat's terms, as a node stores it) that leaves a response incomplete: its reason
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def finish_of(response: Any) -> str:
    """A Responses upstream's answer (a response object) as a node's finish reason: chat's terms,
    as every other node's -- ``tool_calls`` when the answer calls a tool the client runs (a function
    or a custom tool), as the same answer stores through a chat client or over a chat upstream."""
    if not isinstance(response, dict):
        return "stop"
    if response.get("status") != "incomplete":
        output = response.get("output") if isinstance(response.get("output"), list) else []
        calls = any(isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call") for item in output)
        return "tool_calls" if calls else "stop"
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return next((finish for finish, said in _INCOMPLETE.items() if said == reason), "length")


def response_object(*, node_id: uuid.UUID, params: dict[str, Any], output: list[dict[str, Any]],
                    usage: dict[str, Any] | None, status: str = "completed", model: str | None = None,
                    error: dict[str, Any] | None = None, finish_reason: str | None = None,
                    instructions: Any = None, created_at: float | None = None,
                    completed_at: float | None = None) -> dict[str, Any]:
    """A Responses ``response`` object for a node (``completed_at``: when it completed, now when not
    given; said only of a completed one, as OpenAI's)."""
    from .items import response_id

    incomplete = {"reason": _INCOMPLETE[finish_reason]} if finish_reason in _INCOMPLETE else None
    if incomplete and status == "completed":
        status = "incomplete"
    text = params.get("text") if isinstance(params.get("text"), dict) else {"format": {"type": "text"}}
    return {
        "id": response_id(node_id),
        "object": "response",
        "created_at": int(created_at if created_at is not None else time.time()),
        "status": status,
        "completed_at": (int(completed_at if completed_at is not None else time.time()) if status == "completed"
                         else None),
        "background": params.get("background") is True,  # (asked for: answered as it ran all the same)
        "error": error,
        "incomplete_details": incomplete,
        "instructions": instructions,
        "max_output_tokens": params.get("max_output_tokens"),
        "model": model or params.get("model"),
        "output": output,
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "previous_response_id": params.get("previous_response_id"),
        "conversation": conversation_of(params),
        "reasoning": params.get("reasoning") or {"effort": None, "summary": None},
        "store": params.get("store", True),
        "temperature": params.get("temperature", 1.0),
        "text": text,
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
        "top_p": params.get("top_p", 1.0),
        "truncation": params.get("truncation", "disabled"),
        "usage": usage,
        "user": params.get("user"),
        "metadata": params.get("metadata") or {},
    }
