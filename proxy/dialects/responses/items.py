"""Responses items -> chat messages (the way back: ``outbound``): what lets one conversation mix both APIs
(docs/behaviour.md#the-responses-api). Pure functions.

Inside the proxy a path is read as chat messages (assembly, compaction, token estimates, matching
all speak them). A node stored by a Responses call holds items; ``to_messages`` turns them into
messages, keeping the original items beside them under ``ITEMS`` so that a request to a
Responses upstream can send them back natively (``outbound.to_items``); anything a chat upstream cannot
read is dropped there (``assembly.strip``).

    message (input or output) item        -> user / system / developer / assistant message (an
                                              answer's after its calls: with them, msg_<node>; its
                                              text after the answer's first, msg_<node>_<i>)
    function_call items after a message    -> that assistant message's tool_calls (also one sent after
                                              a result of its answer's: ids fc_<node>_<i> say which)
    custom_tool_call                       -> the same, a function call with one argument, ``input``
                                              (as a chat upstream is offered a custom tool: tools.py)
    function_call_output,
    custom_tool_call_output                -> tool message (text only: an image or a file as a line;
                                              an Anthropic upstream gets it: ``tool_output_parts``)
    tool_search_call, tool_search_output   -> a call of the function ``tool_search`` and its result,
      (the client's: execution "client")      which names the tools it loaded (those go with every
                                              later call over chat: ``loaded_tools``)
    reasoning (summary only)               -> reasoning_content of the next assistant message
    compaction (a summary, as the proxy's  -> the user message holding its summary, as the compaction
      compaction items carry it)              node has it (its token names a node: never sent upstream)
    reasoning with encrypted_content, and
    any other item (web search calls ...)  -> kept under ITEMS only: a Responses upstream gets them
                                              back (reasoning: only the provider that produced it)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import msgspec

from ...surrogates import encode, loads
from .. import signed
from ..chat.completion import NotACompletion
from .answered import after, call_of, joins, message_of
from .compaction import compaction_node_of
from .parts import content_of, tool_output
from .tools import LOADED, SEARCH, custom_arguments, flat_name, members

__all__ = [
    "CALLS",
    "ITEMS",
    "ITEMS_OF",
    "PRODUCER",
    "RESULTS",
    "cleared",
    "client_search",
    "convert",
    "input_items",
    "items_of",
    "loaded_tools",
    "node_id_of",
    "read_response",
    "reasoning_text",
    "response_id",
    "to_messages",
    "tool_output_parts",
]

ITEMS = "_bp_items"  # the native items a message was made from
ITEMS_OF = "_bp_items_of"  # the dialect they are items of: "responses" or "messages" (``items_of``)
PRODUCER = "_bp_producer"  # the provider that produced them (opaque reasoning goes back only there)


def items_of(message: dict[str, Any]) -> str | None:
    """The dialect whose items a message keeps under ``ITEMS`` -- only that dialect's upstream may
    get them back as they are; any other gets the message translated. Messages read before the
    dialect was recorded beside them (kept raw in a compaction node) by their shape: Responses
    items have a ``type`` or ``input_``/``output_`` parts, Anthropic messages neither."""
    native = message.get(ITEMS)
    if not native:
        return None
    known = message.get(ITEMS_OF)
    if known is not None:
        return known
    for item in native:
        if isinstance(item, dict) and ("type" in item or any(
                isinstance(p, dict) and str(p.get("type", "")).startswith(("input_", "output_"))
                for p in (item.get("content") if isinstance(item.get("content"), list) else ()))):
            return "responses"
    return "messages"


def response_id(node_id: uuid.UUID) -> str:
    """The Responses id naming a node: ``resp_`` + the node id's 32 hex digits."""
    return f"resp_{node_id.hex}"


def node_id_of(value: str | None) -> uuid.UUID | None:
    """The node a Responses id names (None when it does not name one of ours)."""
    if not value or not value.startswith("resp_") or len(value) != 37:
        return None
    try:
        return uuid.UUID(hex=value[5:])
    except ValueError:
        return None


def read_response(content: bytes) -> dict[str, Any]:
    """A Responses upstream's answer, decoded; raises ``NotACompletion`` unless it is a response
    that did not fail."""
    try:
        data = loads(content)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise NotACompletion(f"invalid JSON: {type(exc).__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("output"), list) or data.get("status") == "failed":
        raise NotACompletion("not a completed response")
    if data.get("status") in ("queued", "in_progress"):  # (an answer still to come is no answer)
        raise NotACompletion(f"a response still {data['status']}")
    return data


def input_items(value: Any) -> list[dict[str, Any]]:
    """A request's ``input``: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict)]
    return []


# -- items -> messages ----------------------------------------------------------------------------


CALLS = frozenset({"function_call", "custom_tool_call", "tool_search_call"})
RESULTS = frozenset({"function_call_output", "custom_tool_call_output"})  # (cleared by context editing)


def client_search(item: dict[str, Any]) -> bool:
    """A tool search item the client ran (a server's goes back to a Responses upstream only)."""
    return item.get("type") in ("tool_search_call", "tool_search_output") and item.get("execution") == "client"


def _tool_names(tools: Any) -> list[str]:
    """The chat function names of ``tools`` (a namespace's members by their flat names)."""
    names = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            names.extend(str(flat_name(tool.get("name"), fn.get("name"))) for fn in members(tool) if isinstance(fn, dict))
        elif isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return names


def _search_arguments(value: Any) -> str:
    """A tool search call's arguments (an object) as the JSON of the chat function call standing
    for it; a bare query (a string that is not a JSON object) as ``{"query": ...}``."""
    if isinstance(value, str):
        try:
            decoded = loads(value)
        except msgspec.DecodeError:
            decoded = value
        if isinstance(decoded, dict):
            return value
        value = {"query": decoded}
    return encode(value if isinstance(value, dict) else {}).decode()  # (a streamed query's lone surrogate too)


def loaded_tools(messages: Iterable[Any]) -> list[Any]:
    """The tools the client's tool searches loaded, in the order of the ``tool_search_output``
    items among ``messages``' own items -- and those a compaction's summary of earlier searches
    carries (``LOADED`` on the message: ``proxy.compaction.summaries``)."""
    out: list[Any] = []
    for m in messages:  # (every call offering a search reads its whole history: one look at most)
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":  # (a summary's)
            carried = m.get(LOADED)
            if isinstance(carried, list):
                out.extend(carried)
            continue
        if role != "tool":  # (a search's output reads as a tool message)
            continue
        native = m.get(ITEMS)
        for item in native if isinstance(native, list) else ():
            if isinstance(item, dict) and item.get("type") == "tool_search_output" and client_search(item) \
                    and isinstance(item.get("tools"), list):
                out.extend(item["tools"])
    return out


def tool_output_parts(message: dict[str, Any]) -> Any:
    """The chat parts of the Responses tool output a tool message was read from, its images and
    files as parts (the message itself has them as lines, ``parts.tool_output``) -- for an upstream
    whose tool result takes them (Anthropic's); None when the message holds no such output."""
    if items_of(message) != "responses":
        return None
    for item in reversed(message.get(ITEMS) or ()):
        if isinstance(item, dict) and item.get("type") in RESULTS:
            output = item.get("output")
            return content_of(output, output=False)[0] if isinstance(output, list) else None
    return None


def to_messages(items: Iterable[Any], producer: str | None = None) -> list[dict[str, Any]]:
    """Chat messages standing for Responses ``items`` (see the module docstring)."""
    return convert(items, producer)[0]


def convert(items: Iterable[Any], producer: str | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """(messages, ordinals): the messages standing for ``items``, and for each item the
    1-based number of the non-system message it belongs to (0: a system/developer message) --
    how many of the client's messages a stored tail of items starts after."""
    out: list[dict[str, Any]] = []
    ordinals: list[int] = []
    waiting: list[int] = []  # indexes (into ordinals) of items that belong to the next message
    counted = 0
    pending: list[dict[str, Any]] = []  # items waiting for the message they belong to
    reasoning: list[str] = []
    last_assistant: dict[str, Any] | None = None  # function calls join the assistant message before them
    number = 0  # its message number
    # the assistant message whose calls the results after it answer, and the answer of ours its
    # calls came from: a call of the same answer sent after another's result (OpenAI's guide
    # appends each call, then its result) joins it again -- one answer, one message, as stored
    answered: tuple[dict[str, Any], str, int] | None = None

    def attach(message: dict[str, Any], *native: dict[str, Any]) -> dict[str, Any]:
        nonlocal counted
        message[ITEMS] = [*pending, *native]
        message[ITEMS_OF] = "responses"
        if producer is not None:
            message[PRODUCER] = producer
        pending.clear()
        if message.get("role") in ("system", "developer"):
            number = 0
        else:
            counted += 1
            number = counted
        for w in waiting:
            ordinals[w] = number
        waiting.clear()
        return message

    for item in items:
        if not isinstance(item, dict):
            ordinals.append(counted)
            continue
        ordinals.append(-1)
        waiting.append(len(ordinals) - 1)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message" and answered is not None and (joined := joins(item, answered)) is not None:
            # (one answer, one assistant message: its text joins its calls, as stored)
            joined["content"], refusal = after(joined.get("content"), *content_of(item.get("content"), output=True))
            if refusal:
                joined["refusal"] = refusal
            if reasoning:
                joined["reasoning_content"] = (joined.get("reasoning_content") or "") + "".join(reasoning)
                reasoning.clear()
            joined[ITEMS] = [*joined.get(ITEMS, []), *pending, item]
            pending.clear()
            number = answered[2]
            # (a call after it joins it only while nothing came between: after the answer's tool
            # results, a call without this answer's id is the next answer's own)
            last_assistant = joined if out and out[-1] is joined else None
            for w in waiting:
                ordinals[w] = number
            waiting.clear()
        elif kind == "message":
            role = item.get("role") or "user"
            content, refusal = content_of(item.get("content"), output=role == "assistant")
            message: dict[str, Any] = {"role": role, "content": content}
            if refusal:
                message["refusal"] = refusal
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning.clear()
            out.append(attach(message, item))
            last_assistant, number, answered = (message if role == "assistant" else None), counted, None
            # (an answer's message of ours: a second message item of its answer joins it, as when
            # its calls came between -- reasoning that went on after the text was streamed as an
            # item of its own, and the text after it as another message item, msg_<node>_<i>)
            origin = message_of(item.get("id"))
            if role == "assistant" and origin is not None:
                answered = (message, origin, counted)
        elif kind in CALLS and (kind != "tool_search_call" or client_search(item)):
            name = flat_name(item.get("namespace"), item.get("name"))
            if kind == "custom_tool_call":
                arguments = custom_arguments(item.get("input"))
            elif kind == "tool_search_call":
                name, arguments = SEARCH, _search_arguments(item.get("arguments"))
            else:
                arguments = item.get("arguments") or ""
            call = {"id": item.get("call_id"), "type": "function", "function": {"name": name, "arguments": arguments}}
            origin = call_of(item.get("id"))
            if last_assistant is None and answered is not None and origin == answered[1] and not reasoning:
                last_assistant, _, number = answered
            if last_assistant is None:
                last_assistant = {"role": "assistant", "content": None}
                if reasoning:
                    last_assistant["reasoning_content"] = "".join(reasoning)
                    reasoning.clear()
                out.append(attach(last_assistant))
                number = counted
            last_assistant.setdefault("tool_calls", []).append(call)
            last_assistant[ITEMS] = [*last_assistant.get(ITEMS, []), *pending, item]
            answered = (last_assistant, origin, number) if origin is not None else None
            pending.clear()
            for w in waiting:
                ordinals[w] = number
            waiting.clear()
        elif kind == "tool_search_output" and client_search(item):
            names = _tool_names(item.get("tools"))
            text = f"Tools loaded: {', '.join(names)}." if names else "No tools found."
            out.append(attach({"role": "tool", "tool_call_id": item.get("call_id"), "content": text}, item))
            last_assistant = None
        elif kind in RESULTS:
            content = tool_output(item.get("output"))
            out.append(attach({"role": "tool", "tool_call_id": item.get("call_id"), "content": content}, item))
            last_assistant = None
        elif kind in ("compaction", "compaction_summary") and compaction_node_of(item) is not None:
            # (ours, among a conversation's items: an upstream's own -- OpenAI's, encrypted -- goes back natively)
            summary = item.get("summary")
            text = "".join(str(p.get("text") or "") for p in summary if isinstance(p, dict)) \
                if isinstance(summary, list) else ""
            if text:
                out.append(attach({"role": "user", "content": text}))
                last_assistant, number, answered = None, counted, None
            else:
                pending.append(item)
        elif kind == "reasoning" and (held := signed.read(item.get("encrypted_content"))) is not None:
            # (ours, after an answer: with the answer it was kept for -- not the next message's)
            answer = _kept_for(out, held)
            if answer is None:
                pending.append(item)
            else:
                answer[ITEMS] = [*answer.get(ITEMS, []), item]
                signed.restore(answer, held)
                waiting.pop()
                ordinals[-1] = counted
        elif kind == "reasoning":
            if not item.get("encrypted_content"):
                reasoning.append(reasoning_text(item))
            pending.append(item)
        else:  # an item chat cannot express: kept for a Responses upstream only
            pending.append(item)
    if pending and out:
        out[-1][ITEMS] = [*out[-1].get(ITEMS, []), *pending]
        out[-1][ITEMS_OF] = "responses"
    for w in waiting:  # trailing items no message follows: they go with the last one
        ordinals[w] = counted
    return out, ordinals


def _kept_for(out: list[dict[str, Any]], held: list[signed.Kept]) -> dict[str, Any] | None:
    """The answer a kept item (``signed``) was kept for, among the messages before it: the
    assistant message holding a call it names, else the last one; None when there is none."""
    named = {call for kept in held for call in kept.calls}
    last = None
    for message in reversed(out):
        if message.get("role") != "assistant":
            continue
        last = last or message
        if named and any(isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"] in named
                         for c in message.get("tool_calls") or ()):
            return message
    return last


def reasoning_text(item: dict[str, Any]) -> str:
    """What a reasoning item says in words: its summary, else its raw reasoning text (a server
    that shows the model's reasoning itself, gpt-oss's)."""
    summary = "".join(str(s.get("text") or "") for s in item.get("summary") or () if isinstance(s, dict))
    if summary:
        return summary
    return "".join(str(c.get("text") or "") for c in item.get("content") or ()
                   if isinstance(c, dict) and c.get("type") == "reasoning_text")


def cleared(item: dict[str, Any], text: str) -> dict[str, Any] | None:
    """A tool result item (``function_call_output``, ``custom_tool_call_output``) with its output
    replaced by ``text`` (a cleared tool result, docs/behaviour.md#context-editing); None for any
    other item."""
    if item.get("type") in RESULTS:
        return {**item, "output": text}
    return None
