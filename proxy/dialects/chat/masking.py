"""The call's credentials masked in a chat stream's text across its deltas (``MaskedChunks``):
what a stored stream's translators and a masked pass-through read chat chunks with
(docs/behaviour.md#limits-and-hostile-peers)."""

from __future__ import annotations

from typing import Any

from ...secrets import TextMasker

__all__ = ["MaskedChunks", "masked_chunks"]


def _index(value: Any) -> Any:
    """A choice's or a call's ``index`` as a key of what is held back: an odd upstream's list or
    object (unhashable) by its text."""
    return value if value is None or type(value) in (int, str, float, bool) else repr(value)


class MaskedChunks:
    """The call's credentials masked in a chat stream's text -- every choice's content, refusal and
    reasoning deltas, its tool calls' and legacy function call's arguments -- however the deltas
    cut them (``secrets.TextMasker``): what may begin a credential is held back, and given out by
    the chunk that finishes its choice, or by ``rest`` at the stream's end. ``apply`` works on a
    chunk already decoded (the translator's own: nothing is decoded twice) and says whether it
    changed it."""

    _FIELDS = ("content", "refusal", "reasoning_content", "reasoning")

    def __init__(self, masker: TextMasker) -> None:
        self.masker = masker

    def apply(self, chunk: Any) -> bool:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            return False
        changed = False
        for choice in chunk["choices"]:
            if isinstance(choice, dict):
                changed = self._choice(choice, _index(choice.get("index", 0))) or changed
        return changed

    def _text(self, holder: dict[str, Any], field: str, key: Any) -> bool:
        value = holder.get(field)
        if not isinstance(value, str) or not value:
            return False
        out = self.masker.feed(key, value)
        if out == value:
            return False
        holder[field] = out
        return True

    def _choice(self, choice: dict[str, Any], index: Any) -> bool:
        delta = choice.get("delta")
        changed = False
        if isinstance(delta, dict):
            for field in self._FIELDS:
                changed = self._text(delta, field, (index, field)) or changed
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    changed = self._text(fn, "arguments", (index, "tool", _index(call.get("index", 0)))) or changed
            if isinstance(delta.get("function_call"), dict):
                changed = self._text(delta["function_call"], "arguments", (index, "function_call")) or changed
        if choice.get("finish_reason") and self.masker.holding:
            held = self._held(index)
            if held:
                choice["delta"] = _with_held(delta if isinstance(delta, dict) else {}, held)
                changed = True
        return changed

    def release_reasoning(self, chunk: Any) -> None:
        """When a (masked) chunk's text begins the answer: its choices' reasoning held back goes
        out in it, before the text -- for a translation that says reasoning and text as blocks one
        after the other (Anthropic's), which must close the reasoning whole, not give its last
        characters in a block after the text. (The price: a key whose first characters end the
        reasoning and whose rest a later reasoning delta brings is not masked; a stream that goes
        back to reasoning after its text is rare, and a key cut exactly there rarer.)"""
        if not self.masker.holding or not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            return
        for choice in chunk["choices"]:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str) and delta["content"]:
                index = _index(choice.get("index", 0))
                for field in ("reasoning_content", "reasoning"):
                    if (index, field) in self.masker.held():
                        delta[field] = (delta.get(field) or "") + self.masker.flush((index, field))

    def release_before_items(self, chunk: Any) -> None:
        """When a (masked) chunk begins another item of a translation that says an answer's items
        one after the other (the Responses API's output items): what the items before it hold back
        goes out in it first -- the reasoning held when text, a refusal or a tool call comes, and
        the text and refusal held when a call comes. Each item is then masked on its own, as a
        Responses upstream's parts are (a credential cut exactly across two items is not)."""
        if not self.masker.holding or not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            return
        for choice in chunk["choices"]:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            calls = isinstance(delta.get("tool_calls"), list) and bool(delta["tool_calls"])
            if not calls and not any(isinstance(delta.get(f), str) and delta[f] for f in ("content", "refusal")):
                continue
            index = _index(choice.get("index", 0))
            held = self.masker.held()
            for field in ("reasoning_content", "reasoning", *(("content", "refusal") if calls else ())):
                if (index, field) in held:
                    delta[field] = (delta.get(field) or "") + self.masker.flush((index, field))

    def _held(self, index: Any) -> dict[Any, str]:
        return {key: self.masker.flush(key) for key in self.masker.held() if key[0] == index}

    def rest(self) -> list[dict[str, Any]]:
        """The choices still holding text back when the stream ends (no finishing chunk came):
        one choice delta each, to be sent in a chunk of their own."""
        indexes = sorted({key[0] for key in self.masker.held()}, key=str)
        return [{"index": i, "delta": _with_held({}, self._held(i))} for i in indexes]


def _with_held(delta: dict[str, Any], held: dict[Any, str]) -> dict[str, Any]:
    """``delta`` with the text held back for its choice appended, field by field."""
    for key, text in held.items():
        if key[1] == "tool":
            delta.setdefault("tool_calls", []).append({"index": key[2], "function": {"arguments": text}})
        elif key[1] == "function_call":
            fc = delta.setdefault("function_call", {})
            fc["arguments"] = (fc.get("arguments") or "") + text
        else:
            delta[key[1]] = (delta.get(key[1]) or "") + text
    return delta


def masked_chunks(secrets: Any) -> MaskedChunks | None:
    """The masker of a chat stream carrying these credentials (None: there are none)."""
    masker = TextMasker(secrets)
    return MaskedChunks(masker) if masker else None
