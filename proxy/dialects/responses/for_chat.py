"""Chat-completions clients over a Responses upstream (``api = "responses"``): the request's
fields in Responses terms, the answer as a chat completion, the event stream as chat chunks
(docs/behaviour.md#the-responses-api). Pure functions and one relay translator.

    chat request field                        Responses field
    max_tokens, max_completion_tokens         max_output_tokens (16 at least: the API's minimum)
    tools / tool_choice ({type, <type>: {...}}) the same, flattened ({type, name, ...}); a function
                                              not saying ``strict`` gets ``strict: false`` (chat's
                                              default; the Responses API's is strict)
    response_format                           text.format
    reasoning_effort, verbosity               reasoning.effort, text.verbosity
    stream_options, seed, store               dropped (usage always comes; the proxy owns state)
    n > 1, stop, logit_bias, logprobs,        refused (400 invalid_request): no equivalent, and
    penalties, audio, legacy functions ...    dropping them would change the answer
    anything else                             forwarded as it is

The stored answer is the assistant message (reasoning summaries as ``reasoning_content``), so a
conversation may move between chat and Responses upstreams; encrypted reasoning is not kept.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from ...assembly import strip
from ...errors import InvalidRequest
from ...failures import Failure
from ...secrets import Masker
from ...sse import DONE, payload, sse_error_event
from ...surrogates import encode
from ..chat.masking import MaskedChunks
from .items import reasoning_text, to_messages
from .tools import flat_name
from .translate import chat_usage_of

__all__ = ["ToChat", "check_fields", "completion", "finish_reason", "message_of", "request_fields"]


_DROPPED = frozenset({"stream_options", "seed", "store", "messages"})
_LEAST_OUTPUT = 16  # the smallest max_output_tokens the Responses API takes (OpenAI's: 400 below it)
# chat fields with no Responses equivalent: refused unless they hold the value that changes nothing
_REFUSED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "stop": (None, "", []), "logit_bias": (None, {}), "logprobs": (None, False),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "functions": (None, []), "function_call": (None,),
    "web_search_options": (None,),
}


def _flatten(value: Any) -> Any:
    """``{"type": "function", "function": {...}}`` -> ``{"type": "function", ...}`` (chat nests a
    tool's or a tool choice's fields under its type; Responses does not)."""
    if isinstance(value, dict) and isinstance(value.get("type"), str) and isinstance(value.get(value["type"]), dict):
        kind = value["type"]
        return {"type": kind, **{k: v for k, v in value.items() if k not in ("type", kind)}, **value[kind]}
    return value


def _tool(tool: Any) -> Any:
    """A chat tool as a Responses one. A function that does not say ``strict`` is not strict in
    chat, and is in the Responses API (every property required): it says ``strict: false``."""
    tool = _flatten(tool)
    if isinstance(tool, dict) and tool.get("type") == "function" and "strict" not in tool:
        tool = {**tool, "strict": False}
    return tool


def _tool_choice(choice: Any) -> Any:
    choice = _flatten(choice)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools" and isinstance(choice.get("tools"), list):
        choice = {**choice, "tools": [_flatten(t) for t in choice["tools"]]}
    return choice


def check_fields(params: dict[str, Any], name: Callable[[str], str] = str) -> None:
    """Raise ``InvalidRequest`` for a field the Responses API cannot honour (checked once, before
    the call starts; ``request_fields`` then leaves such fields out), under the name the client
    gave it (``name``: a client of a third API sent it as its own field, translated to chat's)."""
    for field, harmless in _REFUSED.items():
        if field in params and params[field] not in harmless:
            raise InvalidRequest(f"{name(field)!r} has no equivalent in the Responses API, which this model's upstream "
                                 "speaks (api = \"responses\")", param=name(field))


def request_fields(params: dict[str, Any]) -> dict[str, Any]:
    """The Responses request fields (all but ``input``) for a chat request's other fields, which
    ``check_fields`` has passed."""
    out: dict[str, Any] = {}
    text: dict[str, Any] = {}
    for key, value in params.items():
        if key in _DROPPED or key in _REFUSED or key.startswith("_bp_"):  # (_bp_: our own keys)
            continue
        if key in ("max_tokens", "max_completion_tokens"):
            if value is not None:  # (at least what the API takes: Claude Code's quota probe asks 1)
                out["max_output_tokens"] = max(value, _LEAST_OUTPUT) if type(value) is int else value
        elif key == "tools":
            out["tools"] = [_tool(t) for t in value or ()]
        elif key == "tool_choice":
            out["tool_choice"] = _tool_choice(value)
        elif key == "response_format":
            fmt = _flatten(value)  # {"type": "json_schema", "json_schema": {...}} -> {"type": "json_schema", ...}
            if isinstance(fmt, dict) and fmt.get("type") != "text":
                text["format"] = fmt
        elif key == "reasoning_effort":
            if value is not None:
                out["reasoning"] = {**(out.get("reasoning") or {}), "effort": value}
        elif key == "verbosity":
            if value is not None:
                text["verbosity"] = value
        else:
            out[key] = value
    if text:
        out["text"] = {**(out.get("text") or {}), **text}
    out["store"] = False
    return out


def message_of(output: list[Any], provider: str | None = None) -> dict[str, Any]:
    """The assistant message a response's output items stand for (one, however many items)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    texts: list[str] = []
    for m in strip(to_messages(output, provider)):
        if m.get("role") != "assistant":
            continue
        content = m.get("content")
        if isinstance(content, str) and content:
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        for key in ("refusal", "reasoning_content"):
            if m.get(key):
                message[key] = (message.get(key) or "") + m[key]
        if m.get("tool_calls"):
            message.setdefault("tool_calls", []).extend(m["tool_calls"])
    if texts:
        message["content"] = "".join(texts)
    if not message.get("reasoning_content"):  # (an encrypted item's summary: what a stream shows of it)
        summary = "".join(reasoning_text(item) for item in output if isinstance(item, dict)
                          and item.get("type") == "reasoning" and item.get("encrypted_content"))
        if summary:
            message["reasoning_content"] = summary
    return message


def finish_reason(response: dict[str, Any], message: dict[str, Any]) -> str:
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if message.get("tool_calls") else "stop"


def _completion_id(node_id: uuid.UUID) -> str:
    return f"chatcmpl-{node_id.hex}"


def completion(response: dict[str, Any], node_id: uuid.UUID, provider: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the chat completion a client gets, the assistant message stored) for a Responses answer."""
    output = response.get("output")
    message = message_of(output if isinstance(output, list) else [], provider)
    body = {
        "id": _completion_id(node_id),
        "object": "chat.completion",
        "created": int(response.get("created_at") or time.time()),
        "model": response.get("model"),
        "choices": [{"index": 0, "message": {**message, "refusal": message.get("refusal")}, "logprobs": None,
                     "finish_reason": finish_reason(response, message)}],
        "usage": chat_usage_of(response.get("usage")),
    }
    return body, message


class ToChat:
    """A Responses upstream's event stream as chat-completion chunks (a relay translator, see
    ``proxy.relay.Translator``): text, refusal and reasoning-summary deltas as they arrive, each
    function call opened with its id and name and its arguments as they arrive; the finishing
    chunk (and the usage chunk, when the client asked for it) and ``[DONE]`` once the node is
    stored. A failed response ends with the chat error event."""

    def __init__(self, *, node_id: uuid.UUID, provider: str | None, wants_usage: bool,
                 masker: Masker | None = None, chunks: MaskedChunks | None = None) -> None:
        self.masker = masker  # the call's credentials masked in each event
        self.chunks = chunks  # and in the text of the chunks sent, however the deltas cut them
        self.node_id = node_id
        self.provider = provider
        self.wants_usage = wants_usage
        self.finished = False
        self.error: Any = None
        self.final: dict[str, Any] | None = None
        self.done_items: dict[int, dict[str, Any]] = {}
        self.model: str | None = None
        self.created = int(time.time())
        self._opened = False
        self._text: dict[int, str] = {}  # output_index -> text sent so far
        self._calls: dict[int, int] = {}  # output_index -> chat tool-call index
        self._args: dict[int, str] = {}  # chat tool-call index -> arguments sent so far
        self._answer: dict[str, Any] | None = None  # the final response's message, once read
        self._failure: dict[str, Any] | None = None  # the response a response.failed event carried

    # -- the Translator protocol --------------------------------------------------------------

    @property
    def usage(self) -> dict[str, Any] | None:
        response = self.final if self.final is not None else self._failure
        return chat_usage_of(response.get("usage")) if response is not None else None

    @property
    def finish_reason(self) -> str | None:
        return finish_reason(self.final, self._message()) if self.final is not None else None

    def opening(self) -> bytes:
        return b""

    def event(self, raw: bytes) -> bytes:
        if self.masker:
            raw = self.masker.bytes(raw)
        event = payload(raw)
        if event is DONE:
            self.finished = self.finished or self.final is not None
            return b""
        if not isinstance(event, dict):  # (event names and comments too: chat streams have none)
            return b""
        kind = event.get("type")
        response = event.get("response") if isinstance(event.get("response"), dict) else None
        if response is not None and response.get("model"):
            self.model = response["model"]
        if kind in ("response.failed", "error"):
            self.error = (response or {}).get("error") or {k: event.get(k) for k in ("code", "message")}
            self._failure = response  # (its usage: the tokens were spent all the same)
            return b""
        if kind in ("response.completed", "response.incomplete"):
            self.final = response or {}
            self.finished = True
            return b""
        index = event.get("output_index")
        index = index if isinstance(index, int) else 0
        if kind == "response.output_text.delta":
            self._text[index] = self._text.get(index, "") + str(event.get("delta") or "")
            return self._chunk({"content": event.get("delta") or ""})
        if kind == "response.refusal.delta":
            return self._chunk({"refusal": event.get("delta") or ""})
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return self._chunk({"reasoning_content": event.get("delta") or ""})
        item = event.get("item") if isinstance(event.get("item"), dict) else None
        if kind == "response.output_item.added" and item is not None and item.get("type") == "function_call":
            call = self._calls[index] = len(self._calls)
            self._args[call] = str(item.get("arguments") or "")
            name = flat_name(item.get("namespace"), item.get("name"))  # (as the whole answer names it)
            return self._chunk({"tool_calls": [{"index": call, "id": item.get("call_id"), "type": "function",
                                                "function": {"name": name, "arguments": self._args[call]}}]})
        if kind == "response.function_call_arguments.delta" and index in self._calls:
            call = self._calls[index]
            self._args[call] += str(event.get("delta") or "")
            return self._chunk({"tool_calls": [{"index": call, "function": {"arguments": event.get("delta") or ""}}]})
        if kind == "response.output_item.done" and item is not None:
            self.done_items[index] = item
            return self._rest(index, item)
        return b""

    def _rest(self, index: int, item: dict[str, Any]) -> bytes:
        """What a finished item holds beyond the deltas already sent (an upstream may send an
        item whole, without deltas)."""
        if item.get("type") == "function_call" and index in self._calls:
            call = self._calls[index]
            arguments = str(item.get("arguments") or "")
            if arguments.startswith(self._args[call]) and len(arguments) > len(self._args[call]):
                rest, self._args[call] = arguments[len(self._args[call]):], arguments
                return self._chunk({"tool_calls": [{"index": call, "function": {"arguments": rest}}]})
        elif item.get("type") == "message":
            text = "".join(p.get("text", "") for p in item.get("content") or ()
                           if isinstance(p, dict) and p.get("type") in ("output_text", "text"))
            sent = self._text.get(index, "")
            if text.startswith(sent) and len(text) > len(sent):
                self._text[index] = text
                return self._chunk({"content": text[len(sent):]})
        return b""

    def _line(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": _completion_id(self.node_id), "object": "chat.completion.chunk", "created": self.created,
                 "model": self.model, "choices": choices, **extra}
        if self.chunks is not None:  # (what may begin a credential: held back, given out by the finishing chunk)
            self.chunks.apply(chunk)
            self.chunks.release_reasoning(chunk)  # (reasoning held back goes out before the text)
        return b"data: " + encode(chunk) + b"\n\n"

    def _open(self) -> bytes:
        """The first chunk (the role), once."""
        if self._opened:
            return b""
        self._opened = True
        return self._line([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])

    def _chunk(self, delta: dict[str, Any]) -> bytes:
        return self._open() + self._line([{"index": 0, "delta": delta, "finish_reason": None}])

    def _message(self) -> dict[str, Any]:
        """The answer so far: the final response's, read once it came (the relay, the store and
        the closing chunk all ask for it), else the items finished before the stream broke off."""
        if self._answer is not None:
            return self._answer
        output = self.final.get("output") if self.final is not None else None
        if not isinstance(output, list) or not output:
            output = [self.done_items[i] for i in sorted(self.done_items)]
        message = message_of(output, self.provider)
        if self.final is not None:
            self._answer = message
        return message

    def received(self) -> list[dict[str, Any]]:
        return [self._message()]

    def closing(self) -> bytes:
        out = self._open()  # (an empty answer still has its role chunk)
        out += self._line([{"index": 0, "delta": {}, "finish_reason": self.finish_reason}])
        if self.wants_usage:
            out += self._line([], usage=self.usage)
        return out + b"data: [DONE]\n\n"

    def ended(self) -> bytes:
        return b""  # (a Responses stream ends with its completion event, or it was cut)

    def complete(self) -> bool:
        return self.final is not None

    def failing(self, failure: Failure) -> bytes:
        err = failure.error
        return sse_error_event(err.message, err.type, err.code)
