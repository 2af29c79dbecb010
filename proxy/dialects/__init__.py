"""API dialects: everything about a call that depends on the API it speaks -- the client's, and
the upstream's (docs/architecture.md#dialects).

A ``Dialect`` is one API (chat completions, Responses, ...), one package here and one line in
``_REGISTRY``. Its client side reads a request into the items a node stores and says how those
items read as chat messages -- the lingua franca of assembly, matching, compaction and token
estimates; its upstream side builds the body an upstream speaking it receives, and its answers
and streams are turned into what each client gets.

A call crosses from its client's dialect to its upstream's through a ``Crossing``
(``crossing(client, upstream)``):

    client == upstream     the request's fields go natively; the answer is relayed, with our ids
    one of the two: chat   translated both ways by the other dialect (its ``*_chat`` parts)
    neither is chat        through chat: the client's fields to chat to the upstream's; the answer
                           from the upstream's to chat to the client's (``_Through``)

Chat is the pivot: a dialect translates to and from chat, never to every other dialect. The
lifecycle, the relay, the builder and storage know only these interfaces. An upstream's ``api``
setting names its dialect too (``anthropic`` is the ``messages`` dialect, ``_ALIASES``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import msgspec
import msgspec.structs

from ..errors import InvalidRequest
from ..key_order import carried
from ..relay import Translator
from .bodies import OWN, parse_model_request, refuse_own_keys

__all__ = ["CACHE_WRITES", "DROPPED_TOOLS", "INHERITED", "Answer", "Crossing", "Dialect", "Exchange", "Transcript", "cleared_result", "crossing", "dialect",
           "message_path", "parse_model_request", "refuse_own_keys", "summary_keys",
           "usage_count"]

# Usage in the pivot's terms is chat's, and one field more: the tokens an upstream wrote to its
# prompt cache (Anthropic's name; chat has none, and counts them among the prompt tokens). Every
# translation that meets them carries them, so a node's usage keeps what the upstream reported.
CACHE_WRITES = "cache_creation_input_tokens"


def usage_count(value: Any) -> int:
    """A token count of an upstream's usage, as a number a translation adds up: anything but a
    plausible whole number (text, a float, a bool, a negative) counts 0 -- an odd usage object is
    the upstream's, and never fails the call it came with."""
    return value if type(value) is int and 0 <= value <= 10**9 else 0

# In a call's params (and its node's): the hosted tools it offered and a translation goes without
# (``Crossing.prepare``), so its build, and its replay, leave them out again.
DROPPED_TOOLS = "_bp_dropped_tools"

# In an imported node's params: it was a node of the exported fork's source (``proxy.transfer``),
# whose call that conversation counted -- its usage is kept, and counted in no usage of the
# import's (the usage report, the conversation's usage). Never sent: a replay leaves it out.
INHERITED = "_bp_inherited"


@dataclass(frozen=True, slots=True)
class Answer:
    """An upstream's answer as a call uses it."""

    body: bytes  # what the client gets
    received: list[dict[str, Any]]  # what is stored, in the client dialect's format
    messages: list[dict[str, Any]]  # the same read as chat messages (the node's transcript)
    usage: dict[str, Any] | None
    finish_reason: str | None


class Exchange(Protocol):
    """How one started call's answer travels back: its JSON answer, or its stream."""

    def answer(self, content: bytes) -> Answer: ...  # raises dialects.chat.NotACompletion

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator: ...  # masking these

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


class Transcript(NamedTuple):
    """A call's items read as chat messages; ``ordinals[i]``: the message (1-based, 0 for a
    system/developer one) item ``i`` stands for -- None when each item is one message."""

    messages: list[dict[str, Any]]
    ordinals: list[int] | None


class Dialect(Protocol):
    name: str  # the node's ``api`` and the upstream's ``api`` setting
    endpoint: str  # the path under an upstream's base URL that speaks it
    parent_param: str  # where a client of it names a call's parent (what an unknown parent's 404 points at)

    # -- the client side --------------------------------------------------------------------
    def parse(self, raw: bytes) -> dict[str, Any]: ...  # the body; raises InvalidRequest
    def items(self, body: dict[str, Any]) -> list[dict[str, Any]]: ...  # what the call sends
    def params(self, body: dict[str, Any]) -> dict[str, Any]: ...  # every other field (stored)
    def read(self, items: list[dict[str, Any]]) -> Transcript: ...
    def to_messages(self, items: Iterable[Any], provider: str | None) -> list[dict[str, Any]]: ...
    def error_body(self, failure: Any) -> bytes: ...  # a ``Failure`` in this API's error shape
    # one of this dialect's own items (kept beside a message it read) that is a tool result, with
    # its output replaced by ``text`` (context editing: a cleared result); None for any other item
    def cleared(self, item: dict[str, Any], text: str) -> dict[str, Any] | None: ...

    # -- translations through chat, and the upstream side ------------------------------------
    def params_to_chat(self, params: dict[str, Any]) -> dict[str, Any]: ...  # may refuse
    def params_from_chat(self, params: dict[str, Any]) -> dict[str, Any]: ...
    # refused before any node; ``name``: what the client calls a chat field (its own API's name)
    def check_from_chat(self, params: dict[str, Any], name: Callable[[str], str] = str) -> None: ...
    def chat_field(self, name: str) -> str: ...  # this API's name of the chat field its own translates to
    def unsupported_by_chat(self, params: dict[str, Any]) -> list[str]: ...  # hosted tools a chat upstream cannot run
    def unsupported_from_chat(self, params: dict[str, Any]) -> list[str]: ...  # a chat client's tools it cannot take
    # refused before any node: a field of this API's own that would change the answer and that its
    # translation through chat cannot carry (rather than dropped: the model would answer without it)
    def check_to_chat(self, params: dict[str, Any]) -> None: ...
    # params a call translated through chat takes from its conversation's history (assembled
    # messages, new ones last), beside its own: the tools a client's tool search loaded
    def history_params(self, params: dict[str, Any], messages: Iterable[dict[str, Any]]) -> dict[str, Any]: ...
    # how many of the most recent assistant turns keep their readable reasoning when the call is
    # translated through chat (a context edit of the client's own: Messages' clear_thinking); None: all
    def reasoning_turns(self, params: dict[str, Any]) -> int | None: ...
    # what a compaction's summary of ``messages`` keeps for ``history_params`` to read back
    def summary_keys(self, messages: Iterable[dict[str, Any]]) -> dict[str, Any]: ...
    def native_params(self, params: dict[str, Any]) -> dict[str, Any]: ...
    def request_body(self, fields: dict[str, Any], messages: Sequence[dict[str, Any]], provider: str | None, *,
                     stream: bool) -> bytes: ...
    def relay(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> Exchange: ...
    def over_chat(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> Exchange: ...
    def for_chat(self, *, node_id: uuid.UUID, provider: str) -> Exchange: ...


def summary_keys(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a compaction's summary message keeps of the history it replaces, beside its text:
    each dialect's ``summary_keys`` (the tools a Responses client's tool searches loaded there,
    which later calls still offer). Keys of the proxy's own: never sent upstream."""
    if not _REGISTRY:
        _REGISTRY.update(_registry())
    out: dict[str, Any] = {}
    for d in {id(d): d for d in _REGISTRY.values()}.values():
        out.update(d.summary_keys(messages))
    return out


@dataclass(frozen=True, slots=True)
class Crossing:
    """A call's way from its client's dialect to its upstream's and back."""

    client: Dialect
    upstream: Dialect

    @property
    def native(self) -> bool:
        return self.client is self.upstream

    def prepare(self, params: dict[str, Any], *, unsupported_tools: str = "drop") -> list[str]:
        """Before anything is stored: refuse what the upstream cannot honour, and name the hosted
        tools a chat upstream cannot run (or a chat client's tools another upstream cannot take)
        -- dropped (returned), or refused when ``unsupported_tools`` is ``"refuse"``."""
        if self.native:
            return []
        if self.client.name == "chat":
            self.upstream.check_from_chat(params)
            dropped = self.upstream.unsupported_from_chat(params)
            if dropped and unsupported_tools == "refuse":
                raise InvalidRequest(f"tool type {dropped[0]!r} cannot be offered to this model's upstream, which speaks "
                                     f"the {self.upstream.name} API (server.unsupported_tools = \"refuse\")", param="tools")
            return dropped
        self.client.check_to_chat(params)
        dropped = self.client.unsupported_by_chat(params)
        if dropped and unsupported_tools == "refuse":
            raise InvalidRequest(f"tool type {dropped[0]!r} needs an upstream that speaks the {self.client.name} API "
                                 f"natively; this model's upstream speaks {self.upstream.name} (server.unsupported_tools "
                                 "= \"refuse\")", param="tools")
        if self.upstream.name != "chat":  # (checked as the call is built: without the dropped tools)
            self.upstream.check_from_chat(self.client.params_to_chat({**params, DROPPED_TOOLS: dropped} if dropped
                                                                     else params), self.client.chat_field)
        return dropped

    def history_params(self, params: dict[str, Any], messages: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """What the call's history adds to its params when it is translated (``Dialect.history_params``)."""
        return {} if self.native else self.client.history_params(params, messages)

    def reasoning_turns(self, params: dict[str, Any], *, accepts_reasoning: bool) -> int | None:
        """How many of the most recent assistant turns keep their reasoning in the upstream request
        (``Dialect.reasoning_turns``), None for all: an edit only a chat upstream that takes readable
        reasoning back needs carried out (any other gets thinking only from its own provider)."""
        if self.native or self.upstream.name != "chat" or not accepts_reasoning:
            return None
        return self.client.reasoning_turns(params)

    def fields(self, params: dict[str, Any], *, max_output: int | None = None) -> dict[str, Any]:
        """The request's other fields as the upstream gets them. Translated, a maximum of output
        tokens above what the model can give (``max_output``, configured) is brought down to it:
        a client of another API asks for its own API's models (Claude Code asks 32,000 or more)."""
        if self.native:
            return self.upstream.native_params(params)
        chat = self.client.params_to_chat(params)
        if max_output:
            for key in ("max_tokens", "max_completion_tokens"):
                value = chat.get(key)
                if type(value) is int and value > max_output:
                    chat = {**chat, key: max_output}
        return carried(params, self.upstream.params_from_chat(chat))  # (the schemas' orders: by name)

    def exchange(self, *, node_id: uuid.UUID, params: dict[str, Any], provider: str) -> Exchange:
        if self.native:
            return self.client.relay(node_id=node_id, params=params, provider=provider)
        if self.upstream.name == "chat":
            return self.client.over_chat(node_id=node_id, params=params, provider=provider)
        if self.client.name == "chat":
            return self.upstream.for_chat(node_id=node_id, provider=provider)
        return _Through(self.client.over_chat(node_id=node_id, params=params, provider=provider),
                        self.upstream.for_chat(node_id=node_id, provider=provider))


class _Through:
    """An answer of one non-chat dialect for a client of another, through chat: the upstream's
    turned into a chat answer (``inner``), that one into the client's (``outer``)."""

    def __init__(self, outer: Exchange, inner: Exchange) -> None:
        self.outer = outer
        self.inner = inner

    def answer(self, content: bytes) -> Answer:
        return self.outer.answer(self.inner.answer(content).body)

    def translator(self, *, wants_usage: bool, secrets: Sequence[str | None] = ()) -> Translator:
        # (both mask: the inner one each upstream event whole, the outer one across the chat
        # chunks -- a credential split across text deltas comes together there, and in the answer
        # the outer one stores)
        return _Chained(self.outer.translator(wants_usage=wants_usage, secrets=secrets),
                        self.inner.translator(wants_usage=True, secrets=secrets))

    def messages(self, received: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.outer.messages(received)


class _Chained:
    """Two stream translators in a row: the upstream's events into chat chunks (``inner``), those
    into the client's events (``outer``); both mask. The inner one's held-back end is passed on
    as soon as its stream ends, so the outer one knows the whole answer before it is stored."""

    def __init__(self, outer: Translator, inner: Translator) -> None:
        from ..sse import SSEParser

        self.outer = outer
        self.inner = inner
        self.parser = SSEParser()
        self._passed_end = False

    def _through(self, chat: bytes) -> bytes:
        out = [self.outer.event(e) for e in self.parser.feed(chat)] if chat else []
        return b"".join(out)

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return self.outer.finished

    @property
    def error(self) -> Any:  # type: ignore[override]
        return self.inner.error if self.inner.error is not None else self.outer.error

    @property
    def usage(self) -> dict[str, Any] | None:  # type: ignore[override]
        return self.outer.usage

    @property
    def finish_reason(self) -> str | None:  # type: ignore[override]
        return self.outer.finish_reason

    def opening(self) -> bytes:
        return self.outer.opening() + self._through(self.inner.opening())

    def event(self, raw: bytes) -> bytes:
        return self._passed(self._through(self.inner.event(raw)))

    def ended(self) -> bytes:
        out = self._passed(self._through(self.inner.ended()))
        return out + b"".join(self.outer.event(e) for e in self.parser.close())  # (its chunks' stream ends here)

    def _passed(self, out: bytes) -> bytes:
        if self.inner.finished and not self._passed_end and self.inner.error is None:
            self._passed_end = True
            out += self._through(self.inner.closing())
        return out

    def closing(self) -> bytes:
        return self.outer.closing()

    def complete(self) -> bool:
        """The upstream's answer was whole (the inner one's): its held-back end -- the finishing
        chunk, the usage seen -- is passed on now, so the outer one holds the whole answer too."""
        if self.inner.error is not None or not self.inner.complete():
            return False
        if not self._passed_end:
            self._passed_end = True
            self._through(self.inner.closing())
        return self.outer.complete()

    def failing(self, failure: Any) -> bytes:
        return self.outer.failing(failure)

    def received(self) -> list[dict[str, Any]]:
        return self.outer.received()


def _registry() -> dict[str, Dialect]:
    from . import chat, messages, responses

    found: dict[str, Dialect] = {d.name: d for d in (chat.DIALECT, responses.DIALECT, messages.DIALECT)}
    found.update({alias: found[name] for alias, name in _ALIASES.items()})
    return found


_ALIASES = {"anthropic": "messages"}  # an upstream's ``api`` -> the dialect it speaks


_REGISTRY: dict[str, Dialect] = {}


def dialect(name: str | None) -> Dialect:
    """The dialect of this name (a node's ``api``; None: chat, as nodes stored before there were
    others)."""
    if not _REGISTRY:
        _REGISTRY.update(_registry())
    try:
        return _REGISTRY[name or "chat"]
    except KeyError:
        raise ValueError(f"unknown API dialect {name!r}") from None


def crossing(client: Dialect | str, upstream: Dialect | str) -> Crossing:
    client = dialect(client) if isinstance(client, str) else client
    upstream = dialect(upstream) if isinstance(upstream, str) else upstream
    return Crossing(client, upstream)


def message_path(path: Sequence[Any]) -> list[Any]:
    """A stored path read as chat messages: nodes another dialect made are converted (their own
    items kept beside the messages); chat nodes are returned as they are."""
    if all(getattr(node, "api", "chat") == "chat" for node in path):
        return list(path)  # the usual case: nothing to convert
    out = []
    for node in path:
        api = getattr(node, "api", "chat")
        if api == "chat":
            out.append(node)
            continue
        d = dialect(api)
        out.append(msgspec.structs.replace(
            node, api="chat", sent=d.to_messages(node.sent, node.provider),
            received=d.to_messages(node.received, node.provider) if node.received else node.received))
    return out


_ITEMS = OWN + "items"  # (responses.items.ITEMS: a message's own items, of the dialect that read it)


def cleared_result(message: dict[str, Any], text: str) -> dict[str, Any]:
    """A tool result message with its content replaced by ``text`` (a cleared result,
    docs/behaviour.md#context-editing): the chat message's, and that of each dialect's own item
    kept beside it -- so an upstream of that dialect gets the placeholder natively too."""
    out = {**message, "content": text}
    native = message.get(_ITEMS)
    if isinstance(native, list):
        if not _REGISTRY:
            _REGISTRY.update(_registry())
        kinds = {id(d): d for d in _REGISTRY.values()}.values()
        out[_ITEMS] = [next((c for d in kinds if isinstance(item, dict) and (c := d.cleared(item, text)) is not None),
                            item) for item in native]
    return out
