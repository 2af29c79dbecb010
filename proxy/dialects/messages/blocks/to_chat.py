"""A Messages request read the way the tree reads it: its messages cut into fragments
(``fragments``; ``CONT`` and ``INLINE`` mark what putting them back together needs) and each
fragment read as the chat message it stands for (``to_message`` / ``to_messages``), the fragment
kept under ``ITEMS``; and a fragment's tool result cleared (``cleared``). Pure functions; the
package docstring (``blocks/__init__.py``) has the table of fragments and chat messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ....surrogates import encode
from ... import signed
from ...lines import digest
from ...responses.items import ITEMS, ITEMS_OF, PRODUCER

__all__ = ["CONT", "INLINE", "cleared", "fragments", "to_message", "to_messages"]

CONT = "_bp_cont"  # this fragment continues the Anthropic message of the one before
INLINE = "_bp_inline"  # a system message among the messages (not the ``system`` field)


_ERRORED = "[the tool failed] "  # a tool result's is_error, as a chat tool message says it


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    return [] if content is None else [content]


# -- a request's messages -> fragments ------------------------------------------------------------


def fragments(system: Any, messages: Sequence[Any]) -> list[dict[str, Any]]:
    """A request's items: the system item (when ``system`` is given), then each message cut into
    the fragments it reads as (see the package docstring, ``blocks/__init__.py``)."""
    out: list[dict[str, Any]] = []
    if system is not None and system != [] and system != "":
        out.append({"role": "system", "content": system})
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            out.append({**message, INLINE: True})
            continue
        if role != "user" or not isinstance(content, list) or not any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            out.append(message)  # one message, one fragment (as it came)
            continue
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        groups: list[list[Any]] = []  # each tool result alone; the blocks between them together
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                groups.append([block])
                groups.append([])
            elif groups:
                groups[-1].append(block)
            else:
                groups.append([block])
        for i, group in enumerate(g for g in groups if g):
            out.append({"role": "user", "content": group, **extra, **({CONT: True} if i else {})})
    return out


# -- fragments -> chat messages -------------------------------------------------------------------


def _text(block: dict[str, Any]) -> str | None:
    text = block.get("text")
    return text if block.get("type") == "text" and isinstance(text, str) else None


def _image_part(block: dict[str, Any]) -> dict[str, Any] | None:
    """An image of bytes (base64) or by URL as chat's image part; None for any other (by an
    Anthropic file id: nothing another provider can fetch)."""
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', '')};base64,{source['data']}"
    elif isinstance(source.get("url"), str) and source["url"]:
        url = source["url"]
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _file_part(block: dict[str, Any]) -> dict[str, Any] | None:
    """A document of bytes (a PDF, base64) as chat's file part, which OpenAI's models read; None
    for any other document (by URL or by an Anthropic file id: nothing another provider can fetch)."""
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    media, data = source.get("media_type"), source.get("data")
    if source.get("type") != "base64" or not isinstance(media, str) or not isinstance(data, str):
        return None
    name = block["title"] if isinstance(block.get("title"), str) and block["title"] else (
        "document.pdf" if media == "application/pdf" else "document")
    return {"type": "file", "file": {"filename": name, "file_data": f"data:{media};base64,{data}"}}


def _user_content(blocks: list[Any], *, files: bool = True) -> Any:
    """Chat content of user blocks: the text joined when there is only text, else parts.
    ``files``: a document of bytes as a file part (a tool message takes text only)."""
    parts: list[dict[str, Any]] = []
    only_text = True
    for block in blocks:
        if not isinstance(block, dict):
            continue
        text = _text(block)
        if text is not None:
            parts.append({"type": "text", "text": text})
        elif block.get("type") == "image" and (image := _image_part(block)) is not None:
            only_text = False
            parts.append(image)
        elif files and block.get("type") == "document" and (file := _file_part(block)) is not None:
            only_text = False
            parts.append(file)
        else:  # other images and documents, search results ...: as text a chat upstream can read
            only_text = False
            parts.append({"type": "text", "text": _as_text(block)})
    if only_text:
        return "".join(p["text"] for p in parts)
    return parts


def _as_text(block: dict[str, Any]) -> str:
    """A block chat has no part for, as text: a plain-text document's own text, a search result's
    texts, else a line saying what it was -- its URL or file id too (its bytes stay in the fragment, for
    Anthropic)."""
    kind = block.get("type")
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    title = f" {block['title']}" if isinstance(block.get("title"), str) else ""
    if kind == "document" and source.get("type") == "text" and isinstance(source.get("data"), str):
        return f"[document{title}]\n{source['data']}"
    if kind == "document" and source.get("type") == "content":  # (a document of the client's own blocks)
        texts = [b["text"] for b in _blocks(source.get("content")) if isinstance(b, dict) and _text(b) is not None]
        return f"[document{title}]\n" + "\n".join(texts)
    if kind == "search_result":
        texts = [b.get("text") for b in _blocks(block.get("content")) if isinstance(b, dict) and isinstance(b.get("text"), str)]
        return f"[search result{title}: {block.get('source', '')}]\n" + "\n".join(texts)
    what = " ".join(str(w) for w in (source.get("media_type") or source.get("type"), _named(block, source)) if w)
    return f"[{kind}{title}{f' ({what})' if what else ''}: not readable by this model]"


def _named(block: dict[str, Any], source: dict[str, Any]) -> str:
    """What names a block read as a line: its URL or its file id, else a digest of the bytes it
    carries ("" for none). The line standing for it says it -- full history compares that line (docs/behaviour.md#full-history-mode),
    and one without it would read alike for any two attachments: another history's would match."""
    for value in (source.get("url"), source.get("file_id"), block.get("file_id")):
        if isinstance(value, str) and value:
            return value
    data = source.get("data")
    if isinstance(data, str) and data:  # (bytes in the block: named by a short digest of them)
        return digest(data)
    return ""


def _tool_content(content: Any) -> Any:
    """A tool result's content as a chat tool message holds it: text only -- chat's tool messages
    take no image (OpenAI refuses the request, and every later call of the conversation with it),
    so an image is a line saying what it was (its bytes stay in the fragment, for an Anthropic
    upstream)."""
    if content is None or isinstance(content, str):
        return content or ""
    blocks = [{"type": "text", "text": _image_in_a_tool_result(b)} if isinstance(b, dict) and b.get("type") == "image"
              else b for b in _blocks(content)]
    return _user_content(blocks, files=False)


def _image_in_a_tool_result(block: dict[str, Any]) -> str:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    what = " ".join(str(w) for w in (source.get("media_type") or source.get("type") or "image", _named(block, source)) if w)
    return f"\n[an image ({what}) the tool returned: a chat tool message cannot carry images]\n"


def _arguments(value: Any) -> str:
    return encode(value if value is not None else {}).decode()  # (a streamed input's lone surrogate too)


# -- Anthropic's server tools (web search, web fetch, code execution, MCP) as lines -----------------

_LINE_MAX = 500  # the most characters of a server tool's input or output a line gives


def _bounded(text: str) -> str:
    text = " ".join(text.split())  # (one line)
    return text if len(text) <= _LINE_MAX else text[:_LINE_MAX] + " …"


def _tool_name(use: dict[str, Any] | None, fallback: str) -> str:
    if use is None:
        return fallback
    if use.get("type") == "mcp_tool_use":
        return f"mcp {use.get('server_name')}.{use.get('name')}"
    return str(use.get("name") or fallback)


def _readable(content: Any, depth: int = 0) -> str:
    """What a server tool's result says, as text: its text blocks, a program's output (stdout,
    stderr, a return code but 0), a fetched document's text, an error's code -- never encrypted
    content."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and depth < 8:
        return " ".join(t for b in content if (t := _readable(b, depth + 1)))
    if not isinstance(content, dict) or depth >= 8:
        return ""
    if isinstance(content.get("error_code"), str):
        return f"failed: {content['error_code']}"
    if content.get("type") == "text" and isinstance(content.get("text"), str):
        return content["text"]
    parts = []
    if isinstance(content.get("stdout"), str) and content["stdout"]:
        parts.append(content["stdout"])
    if isinstance(content.get("stderr"), str) and content["stderr"]:
        parts.append(f"stderr: {content['stderr']}")
    if isinstance(content.get("return_code"), int) and content["return_code"] != 0:
        parts.append(f"exit {content['return_code']}")
    source = content.get("source") if isinstance(content.get("source"), dict) else {}
    if isinstance(source.get("data"), str) and source.get("type") == "text":
        parts.append(source["data"])
    if not parts and isinstance(content.get("content"), str | list | dict):
        parts.append(_readable(content["content"], depth + 1))
    return " ".join(p for p in parts if p)


_USES = ("server_tool_use", "mcp_tool_use")


def uses_of(blocks: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The server and MCP tool uses among ``blocks``, by id (what their results answer)."""
    return {b["id"]: b for b in blocks if isinstance(b, dict) and b.get("type") in _USES and isinstance(b.get("id"), str)}


def server_line(block: Any, uses: Mapping[str, dict[str, Any]]) -> str | None:
    """The line a server tool's call or result (``server_tool_use``, ``*_tool_result``,
    ``mcp_tool_use``, ``mcp_tool_result``) reads as for another model, bounded, without the
    encrypted content Anthropic alone reads; None for any other block. ``uses``: the answer's
    server tool uses by id (``uses_of``), where a result's call is."""
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind in _USES:
        value = block.get("input")
        if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
            value = next(iter(value.values()))  # (a query, a URL, a command: itself)
        return f"[{_tool_name(block, 'tool')} {_bounded(_arguments(value))}]"
    if not isinstance(kind, str) or not kind.endswith("_tool_result"):
        return None
    use = uses.get(block["tool_use_id"]) if isinstance(block.get("tool_use_id"), str) else None
    name = _tool_name(use, kind.removesuffix("_tool_result"))
    content = block.get("content")
    if kind == "web_search_tool_result" and isinstance(content, list):
        found = [r for r in content if isinstance(r, dict) and r.get("type") == "web_search_result"]
        said = ", ".join(f"{r.get('url')} ({r.get('title')})" if r.get("title") else str(r.get("url")) for r in found)
        return f"[{name} result: {len(found)} found{f' -- {_bounded(said)}' if said else ''}]"
    if kind == "web_fetch_tool_result" and isinstance(content, dict) and content.get("type") == "web_fetch_result":
        document = content.get("content") if isinstance(content.get("content"), dict) else {}
        title = f" ({document['title']})" if isinstance(document.get("title"), str) and document["title"] else ""
        text = _bounded(_readable(document))
        return f"[{name} result: {content.get('url')}{title}{f' -- {text}' if text else ''}]"
    text = _bounded(_readable(content))
    if block.get("is_error") is True:
        text = f"failed: {text}" if text else "failed"
    return f"[{name} result{f': {text}' if text else ''}]"


def line_piece(line: str, before: str) -> str:
    """A server tool's line as the assistant's content has it: on a line of its own after what
    ``before`` ends with (the content so far, or its last character)."""
    return ("\n" if before and not before.endswith("\n") else "") + line + "\n"


def _assistant(blocks: list[Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    uses = uses_of(blocks)
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": _arguments(block.get("input"))}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif (line := server_line(block, uses)) is not None:
            # (a server tool's call or result: a line in its place -- another model reads what
            # Claude searched, fetched, ran; the blocks themselves stay in the fragment)
            texts.append(line_piece(line, next((t for t in reversed(texts) if t), "")))
        # redacted thinking and other blocks (a compaction ...): kept in the fragment only
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    for block in blocks:  # (what a translated answer kept that no block has a place for: signed.py)
        if isinstance(block, dict) and block.get("type") == "redacted_thinking" \
                and (held := signed.read(block.get("data"))) is not None:
            signed.restore(message, held)
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if message["content"] is None and not calls:
        message["content"] = ""
    return message


def to_message(fragment: dict[str, Any], producer: str | None = None) -> dict[str, Any]:
    """The chat message a fragment reads as, with the fragment kept under ``ITEMS``."""
    role = fragment.get("role")
    blocks = _blocks(fragment.get("content"))
    if role == "system":
        content = fragment.get("content")
        text = content if isinstance(content, str) else "\n".join(t for b in blocks if isinstance(b, dict)
                                                                   and (t := _text(b)) is not None)
        message: dict[str, Any] = {"role": "system", "content": text}
    elif role == "assistant":
        message = _assistant(blocks)
    elif len(blocks) == 1 and isinstance(blocks[0], dict) and blocks[0].get("type") == "tool_result":
        block = blocks[0]
        content = _tool_content(block.get("content"))
        if block.get("is_error") is True:  # (chat has no field for it: the model reads it in the content)
            content = _ERRORED + content if isinstance(content, str) else [{"type": "text", "text": _ERRORED}, *content]
        message = {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": content}
    else:
        content = fragment.get("content")
        message = {"role": role or "user", "content": content if isinstance(content, str) else _user_content(blocks)}
    message[ITEMS] = [fragment]
    message[ITEMS_OF] = "messages"
    if producer is not None:
        message[PRODUCER] = producer
    return message


def to_messages(items: Iterable[Any], producer: str | None = None) -> list[dict[str, Any]]:
    return [to_message(item, producer) for item in items if isinstance(item, dict)]


def cleared(fragment: dict[str, Any], text: str) -> dict[str, Any] | None:
    """A fragment that is one ``tool_result`` block with that block's content replaced by ``text``
    (a cleared tool result, docs/behaviour.md#context-editing; ``is_error`` and the rest kept);
    None for any other fragment."""
    content = fragment.get("content")
    if fragment.get("role") == "user" and isinstance(content, list) and len(content) == 1 \
            and isinstance(content[0], dict) and content[0].get("type") == "tool_result":
        return {**fragment, "content": [{**content[0], "content": text}]}
    return None
