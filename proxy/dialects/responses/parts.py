"""A Responses item's content parts in chat terms (``items.convert`` reads items with them). Pure
functions.

    a message item's parts       -> chat content: a string when all of it is text, else chat parts
                                    (an image by OpenAI file id as a line naming it: nothing a chat
                                    model or Anthropic can fetch); a refusal part -> the refusal
    a tool output's parts        -> text only, each image or file a line naming it (chat's tool
                                    messages take neither)
"""

from __future__ import annotations

from typing import Any

from ..lines import digest

__all__ = ["content_of", "tool_output"]

_TEXT_IN = frozenset({"input_text", "text"})
_TEXT_OUT = frozenset({"output_text", "text"})


def content_of(content: Any, *, output: bool) -> tuple[Any, str | None]:
    """(chat content, refusal) of a message item's content."""
    if content is None or isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        return content, None
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    refusal = None
    only_text = True
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in (_TEXT_OUT if output else _TEXT_IN) and isinstance(part.get("text"), str):
            texts.append(part["text"])
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            refusal = (refusal or "") + str(part.get("refusal") or "")
        elif kind == "input_image" and not part.get("image_url") and part.get("file_id"):
            # (by OpenAI file id: nothing a chat model or Anthropic can fetch -- its id went as the
            # URL "file:<id>", which both refuse, on every later call -- a line naming it; the
            # item keeps the id for a Responses upstream)
            only_text = False
            parts.append({"type": "text", "text": f"[image (file {part['file_id']}): not readable by this model]"})
        elif kind == "input_image":
            only_text = False
            image: dict[str, Any] = {"url": part.get("image_url")}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            only_text = False
            parts.append({"type": "file", "file": {k: part[k] for k in ("file_id", "file_data", "file_url", "filename") if k in part}})
        else:
            only_text = False
            parts.append(part)
    if only_text:
        return "".join(texts), refusal
    return parts, refusal


def tool_output(output: Any) -> Any:
    """A tool result's ``output`` as a chat tool message holds it: text only -- chat's tool
    messages take no image or file (OpenAI refuses the request, and every later call of the
    conversation, which resends it), so each is a line saying what it was. The item keeps it: a
    Responses upstream gets it back as it came, an Anthropic one in its tool result
    (``items.tool_output_parts``)."""
    if not isinstance(output, list):
        return output
    texts = []
    for part in output:
        if not isinstance(part, dict):
            continue
        if part.get("type") in _TEXT_IN | _TEXT_OUT and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            texts.append(_not_text(part))
    return "".join(texts)


def _not_text(part: dict[str, Any]) -> str:
    """The line standing for a tool output's image, file or other part in a chat tool message --
    naming it (its URL, file id or name, a digest of the bytes it carries): full history compares
    the line, and one alike for any two images would let another history's match
    (docs/behaviour.md#full-history-mode)."""
    kind = part.get("type")
    if kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, str) and url.startswith("data:"):
            what = f"{url[5:].split(';', 1)[0]} {digest(url)}"
        else:
            what = url if isinstance(url, str) and url else \
                f"file {part['file_id']}" if isinstance(part.get("file_id"), str) else "image"
        return f"\n[an image ({what}) the tool returned: a chat tool message cannot carry images]\n"
    if kind == "input_file":
        names = [part[k] for k in ("filename", "file_id", "file_url") if isinstance(part.get(k), str) and part[k]]
        if isinstance(part.get("file_data"), str):
            names.append(digest(part["file_data"]))
        return f"\n[a file ({' '.join(names) or 'file'}) the tool returned: a chat tool message cannot carry files]\n"
    return f"\n[{kind if isinstance(kind, str) else 'a part'} the tool returned: a chat tool message cannot carry it]\n"
