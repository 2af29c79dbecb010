"""A JSON schema as Anthropic's structured outputs take it (``output_config.format``), from one a
chat or Responses client wrote for OpenAI's (``response_format``, ``text.format``). Pure functions.

Anthropic compiles the schema into a grammar and refuses what it cannot compile: an object must
close itself (``additionalProperties: false``), and a constraint it does not enforce (``minimum``,
``maxLength``, ``pattern`` ...) is an error rather than ignored. So, as Anthropic's own SDKs
prepare a schema (their ``transform_schema``): every object is closed, ``oneOf`` reads as
``anyOf``, a list of types as an ``anyOf`` of each, and a keyword it does not take goes into the
description, where the model still reads it. What it takes stays as it came.
"""

from __future__ import annotations

from typing import Any

__all__ = ["output_schema"]

# string formats Anthropic's grammar enforces (another is said in the description)
_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"})
_MAX_DEPTH = 64  # (deeper than any real schema: what is below goes as it came)
# keywords that belong to some types only (a schema of several types is split into one of each)
_OBJECT, _ARRAY, _STRING, _NUMBER = frozenset({"object"}), frozenset({"array"}), frozenset({"string"}), \
    frozenset({"number", "integer"})
_TYPES_OF = {**dict.fromkeys(("properties", "required", "additionalProperties", "patternProperties", "minProperties",
                              "maxProperties"), _OBJECT),
             **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems", "uniqueItems"), _ARRAY),
             **dict.fromkeys(("format", "pattern", "minLength", "maxLength"), _STRING),
             **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), _NUMBER)}


def output_schema(schema: Any, depth: int = 0) -> Any:
    """``schema`` as Anthropic's structured outputs take it (see the module docstring)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return schema
    rest = dict(schema)
    out: dict[str, Any] = {}
    for key in ("$defs", "definitions"):  # (definitions: draft 7's, zod-to-json-schema's)
        defs = rest.pop(key, None)
        if isinstance(defs, dict):
            out[key] = {k: output_schema(v, depth + 1) for k, v in defs.items()}
    for key in ("$ref", "title", "description"):
        if key in rest:
            out[key] = rest.pop(key)
    if "$ref" in out:
        return out
    kind = rest.pop("type", None)
    if isinstance(kind, list):  # ["object", "null"]: one schema of each, with the keywords of its type
        variants = [{key: v for key, v in rest.items() if k in _TYPES_OF.get(key, (k,))} | {"type": k} for k in kind]
        return {**out, "anyOf": [output_schema(v, depth + 1) for v in variants]}
    literal = False
    if isinstance(rest.get("enum"), list) and rest["enum"] and all(_primitive(v) for v in rest["enum"]):
        out["enum"] = rest.pop("enum")
        literal = True
    if "const" in rest and _primitive(rest["const"]):
        out["const"] = rest.pop("const")
        literal = True
    combined = False
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(rest.get(key), list):
            out["allOf" if key == "allOf" else "anyOf"] = [output_schema(v, depth + 1) for v in rest.pop(key)]
            combined = True
            break
    if kind is not None and not literal:
        out["type"] = kind
    # (an object closed: but one whose shapes are its variants' is closed in each of them)
    if (kind == "object" and not combined) or isinstance(rest.get("properties"), dict):
        properties = rest.pop("properties", {})
        out["properties"] = {k: output_schema(v, depth + 1) for k, v in properties.items()} \
            if isinstance(properties, dict) else {}
        rest.pop("additionalProperties", None)
        out["additionalProperties"] = False
        if isinstance(rest.get("required"), list):
            out["required"] = rest.pop("required")
    elif kind == "string" and rest.get("format") in _FORMATS:
        out["format"] = rest.pop("format")
    elif kind == "array":
        if "items" in rest:
            out["items"] = output_schema(rest.pop("items"), depth + 1)
        if rest.get("minItems") in (0, 1):
            out["minItems"] = rest.pop("minItems")
    rest.pop("$schema", None)
    if rest:  # (what it does not enforce, said in words)
        # (in sorted order, at every depth: a replay reads the schema back from jsonb, in another
        # order than the client's, and must write the same words)
        said = ", ".join(f"{k}: {_sorted(rest[k])}" for k in sorted(rest))
        out["description"] = f"{out['description']}\n\n{{{said}}}" if out.get("description") else f"{{{said}}}"
    return out


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _primitive(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))
