"""The chat-completion answer as the proxy reads it: the assistant message, usage and finish
reason of choice 0. Shared by the call lifecycle and the summariser."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import msgspec

from ...surrogates import loads
from .stream import _texts

__all__ = ["Completion", "NotACompletion", "call_id", "parse_completion"]


class NotACompletion(ValueError):
    """The body is not a chat completion; ``str(exc)`` says what was wrong with it."""


class Completion(NamedTuple):
    message: dict[str, Any]
    usage: dict[str, Any] | None
    finish_reason: str | None


def parse_completion(content: bytes) -> Completion:
    try:
        data = loads(content)
        choices = data["choices"]
        # choice 0 by its index, wherever it stands (n > 1: the conversation continues from it)
        choice = next((c for c in choices if isinstance(c, dict) and c.get("index") == 0), None) \
            if isinstance(choices, list) else None
        choice = choices[0] if choice is None else choice
        message = choice["message"]
    except (msgspec.DecodeError, RecursionError) as exc:
        raise NotACompletion(f"invalid JSON: {type(exc).__name__}") from None
    except (KeyError, IndexError, TypeError) as exc:
        raise NotACompletion(f"no choices[0].message: {type(exc).__name__}") from None
    if not isinstance(message, dict):
        raise NotACompletion("choices[0].message is not an object")
    usage = data.get("usage")
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return Completion(_parts_read(message), usage if isinstance(usage, dict) else None,
                      finish if isinstance(finish, str) else None)


def _parts_read(message: dict[str, Any]) -> dict[str, Any]:
    """An answer whose content is a list of parts, as Mistral's reasoning models give it (a
    ``thinking`` part, then ``text`` parts), as its stream is stored (``StreamAccumulator``): the
    thinking parts' texts as ``reasoning_content`` -- which goes back only where reasoning is
    accepted, never as a part another provider refuses -- and the text parts joined; parts of any
    other kind keep the content a list (without its thinking)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    thinking = _texts(content, "thinking")
    rest = [p for p in content if not (isinstance(p, dict) and p.get("type") == "thinking")]
    out = dict(message)
    if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in rest):
        out["content"] = "".join(p["text"] for p in rest) if rest else None
    else:
        out["content"] = rest
    if thinking:
        before = message.get("reasoning_content")
        out["reasoning_content"] = (before if isinstance(before, str) else "") + "".join(thinking)
    return out


def call_id(call: dict[str, Any], node_id: uuid.UUID, index: int) -> str:
    """A chat tool call's id as a translated answer gives it: its own, or -- when the upstream sent
    none or an empty one (several OpenAI-compatible servers do, in streams especially) -- one made
    from the node and the call's place in the answer, so the stream, the whole answer and the
    stored one agree, and the client has an id to answer the call by (Anthropic's and the
    Responses API's clients must; a null one was refused with the next call)."""
    own = call.get("id")
    return own if isinstance(own, str) and own else f"call_{node_id.hex}_{index}"
