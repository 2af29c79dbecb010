"""A stored call's body keeps the order of its JSON Schemas' properties (proxy/key_order.py): the
Responses and Messages dialects towards an upstream of their own kind, as chat's towards chat
(tests/test_chat.py) -- for the call, for ``/request``'s rebuild, for the next turn; and the order
recorded is never sent anywhere (a translated request is made anew, sorted)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx

from tests.anthropic_fake import FakeAnthropic
from tests.conftest import Proxy
from tests.fakes import FakeUpstream

# (neither order sorted, and unlike: each object keeps its own)
STEP = {"type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "string"}},
        "required": ["reasoning", "answer"], "additionalProperties": False}
CALL = {"type": "object", "properties": {"zone": {"type": "string"}, "city": {"type": "object", "properties": {
    "name": {"type": "string"}, "country": {"type": "string"}}}}, "required": ["zone"]}


def _replayed(proxy: Proxy, key: str, node_id: str) -> httpx.Response:
    r = httpx.get(f"{proxy.url}/admin/nodes/{node_id}/request", headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _orders(schema: dict[str, Any]) -> list[list[str]]:
    return [list(schema["properties"]), list(schema["properties"]["city"]["properties"])]


def test_a_responses_call_keeps_its_schemas_order_towards_a_responses_upstream(native: Proxy, upstream: FakeUpstream,
                                                                               key: str, cid: str) -> None:
    client = native.openai(key, conversation=cid)
    fields = {"text": {"format": {"type": "json_schema", "name": "step", "strict": True, "schema": STEP}},
              "tools": [{"type": "function", "name": "weather", "parameters": CALL}]}
    bodies = []
    for text in ("first", "second"):
        raw = client.responses.with_raw_response.create(model="native-1", input=text, **fields)
        sent = upstream.responses_requests[-1].raw
        body = json.loads(sent)
        assert list(body["text"]["format"]["schema"]["properties"]) == ["reasoning", "answer"]
        assert _orders(body["tools"][0]["parameters"]) == [["zone", "city"], ["name", "country"]]
        assert "_bp_key_order" not in body
        replay = _replayed(native, key, raw.headers["x-node-id"])
        assert replay.headers["x-request-verified"] == "true" and replay.content == sent
        bodies.append(body)
    assert bodies[1]["input"][:len(bodies[0]["input"])] == bodies[0]["input"]


def test_a_messages_call_keeps_its_schemas_order_towards_an_anthropic_upstream(mproxy: Proxy, claude: FakeAnthropic,
                                                                               key: str, cid: str) -> None:
    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}", api_key=key, max_retries=0)
    tools = [{"name": "weather", "description": "the weather", "input_schema": CALL}]
    for text in ("first", "second"):
        raw = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, tools=tools,
                                                  messages=[{"role": "user", "content": text}])
        sent = claude.last.raw
        body = json.loads(sent)
        assert _orders(body["tools"][0]["input_schema"]) == [["zone", "city"], ["name", "country"]]
        assert "_bp_key_order" not in body
        r = httpx.get(f"{mproxy.url}/admin/nodes/{raw.headers['x-node-id']}/request", headers={"x-api-key": key},
                      timeout=30)
        assert r.headers["x-request-verified"] == "true" and r.content == sent


def test_a_translated_request_keeps_the_schemas_order_too(mproxy: Proxy, upstream: FakeUpstream,
                                                          claude: FakeAnthropic, key: str, cid: str) -> None:
    """A schema crosses whole into another API's request -- a function's parameters become an
    input_schema, a response format an output format: its properties keep the client's order
    there too (by the names they hold), for the call and its replay."""
    o = mproxy.openai(key, conversation=cid)
    raw = o.chat.completions.with_raw_response.create(
        model="claude-x", messages=[{"role": "user", "content": "over anthropic"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": CALL}}],
        response_format={"type": "json_schema", "json_schema": {"name": "step", "schema": STEP}})
    body = json.loads(claude.last.raw)
    assert _orders(body["tools"][0]["input_schema"]) == [["zone", "city"], ["name", "country"]]
    assert list(body["output_config"]["format"]["schema"]["properties"]) == ["reasoning", "answer"]
    assert "_bp_" not in claude.last.raw.decode()
    assert _replayed(mproxy, key, raw.headers["x-node-id"]).headers["x-request-verified"] == "true"

    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}-m", api_key=key, max_retries=0)
    r = c.messages.with_raw_response.create(model="gpt-x", max_tokens=100, messages=[{"role": "user", "content": "chat"}],
                                            tools=[{"name": "weather", "description": "w", "input_schema": CALL}])
    sent = json.loads(upstream.last.raw)
    assert _orders(sent["tools"][0]["function"]["parameters"]) == [["zone", "city"], ["name", "country"]]
    assert "_bp_" not in upstream.last.raw.decode()
    replay = httpx.get(f"{mproxy.url}/admin/nodes/{r.headers['x-node-id']}/request", headers={"x-api-key": key}, timeout=30)
    assert replay.headers["x-request-verified"] == "true" and replay.content == upstream.last.raw

    mproxy.openai(key, conversation=f"{cid}-r").responses.create(model="gpt-x", input="responses over chat", text={
        "format": {"type": "json_schema", "name": "step", "schema": STEP}})
    sent = json.loads(upstream.last.raw)
    assert list(sent["response_format"]["json_schema"]["schema"]["properties"]) == ["reasoning", "answer"]


def test_the_recorded_order_never_reaches_a_translated_upstream(mproxy: Proxy, upstream: FakeUpstream,
                                                                claude: FakeAnthropic, key: str, cid: str) -> None:
    tools = [{"name": "weather", "description": "the weather", "input_schema": CALL}]
    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}", api_key=key, max_retries=0)
    c.messages.create(model="gpt-x", max_tokens=100, tools=tools, messages=[{"role": "user", "content": "over chat"}])
    assert "_bp_" not in upstream.last.raw.decode()
    o = mproxy.openai(key, conversation=f"{cid}-r")
    o.chat.completions.create(model="claude-x", messages=[{"role": "user", "content": "over anthropic"}],
                              tools=[{"type": "function", "function": {"name": "weather", "parameters": CALL}}])
    assert "_bp_" not in claude.last.raw.decode()
    o.responses.create(model="gpt-x", input="responses over chat", tools=[{"type": "function", "name": "weather",
                                                                           "parameters": CALL}])
    assert "_bp_" not in upstream.last.raw.decode()


def test_a_call_and_its_replay_write_the_same_bytes_in_the_clients_order() -> None:
    """The call's own values are written from their field's bytes (remembered from when its
    params were read), a replay's -- read back from jsonb, keys in another order -- anew: the
    same bytes, every schema's properties in the client's order, every other object sorted.
    Schemas where they hide: anyOf, $defs, items, a property named "properties"."""
    import copy

    import msgspec

    from proxy.key_order import KEY_ORDER, encode_sorted, with_key_order

    inner = {"type": "object", "properties": {"zz": {"type": "string"}, "aa": {"type": "integer"}}}
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {
        "type": "object", "$defs": {"Pt": inner},
        "properties": {"properties": {"type": "object", "properties": {"y": {}, "x": {}}},
                       "list": {"type": "array", "items": inner}, "choice": {"anyOf": [inner, {"type": "null"}]},
                       "b": {"type": "string"}, "a": {"type": "string"}}}}} for i in range(3)]
    body = {"model": "m", "tools": tools, "response_format": {"type": "json_schema", "json_schema": {"schema": inner}},
            "temperature": 0.5}

    def orders(sent: bytes) -> list[list[str]]:
        found: list[list[str]] = []

        def walk(v: Any, schema: bool) -> None:
            if isinstance(v, dict):
                if schema:
                    found.append(list(v))
                for k, x in v.items():
                    walk(x, k == "properties" and not schema)
            elif isinstance(v, list):
                for x in v:
                    walk(x, False)

        walk(json.loads(sent), False)
        return found

    params = with_key_order(body)
    live = encode_sorted({**params, "messages": []})
    stored = msgspec.json.decode(msgspec.json.Encoder(order="sorted").encode(params))  # (jsonb keeps no order)
    assert encode_sorted({**copy.deepcopy(stored), "messages": []}) == live
    assert encode_sorted({**params, "messages": []}) == live  # (again: the long way, the same)
    # (walked as written: response_format before tools, a tool's $defs before its properties)
    expected = [["zz", "aa"], ["properties", "list", "choice", "b", "a"], ["y", "x"], ["zz", "aa"], ["zz", "aa"]]
    assert orders(live) == [["zz", "aa"], *expected * 3]
    assert KEY_ORDER.encode() not in live and b'"model":"m","response_format"' in live  # (the rest sorted)
    # a value not the call's own (changed on the way: tools dropped) is written anew, by the hints that fit it
    changed = {**params, "tools": copy.deepcopy(tools[:1])}
    assert orders(encode_sorted({**changed, "messages": []})) == [["zz", "aa"], *expected]


def test_hints_that_are_no_hints_are_passed_over() -> None:
    """An import's line may hold anything under ``_bp_key_order``: what is not a path of keys and
    indexes with a list of names is passed over (it made ``/request`` fail with 500)."""
    from proxy.key_order import KEY_ORDER, encode_sorted

    body = {"response_format": {"schema": {"properties": {"b": 1, "a": 2}}}, "messages": []}
    for junk in ([[[{"a": 1}], ["x"]]], [[["response_format"], [{"a": 1}]]], [[["response_format", "schema", "properties"],
                                                                               [["x"], "b"]]], "x", [[[True], ["b"]]]):
        sent = encode_sorted({**body, KEY_ORDER: junk})
        assert json.loads(sent) == body
    sent = encode_sorted({**body, KEY_ORDER: [[["response_format", "schema", "properties"], [["x"], "b", "zz"]]]})
    assert sent == b'{"messages":[],"response_format":{"schema":{"properties":{"b":1,"a":2}}}}'


def test_a_schema_crossing_apis_keeps_its_clients_order(mproxy: Proxy, upstream: FakeUpstream,
                                                         claude: FakeAnthropic, key: str, cid: str) -> None:
    """A translated request is made anew, but its schemas' properties keep the client's order:
    a chat client's ``response_format`` and tools reach an Anthropic upstream's ``output_config``
    and ``input_schema`` so, a Responses client's ``text.format`` a chat upstream's
    ``response_format``, a Messages client's ``output_config`` and ``input_schema`` a chat
    upstream's -- and ``/request`` rebuilds each byte for byte (they were sorted: a model asked
    for its ``reasoning`` before its ``answer`` wrote the answer first)."""
    o = mproxy.openai(key, conversation=cid)
    step = {"name": "step", "strict": True, "schema": STEP}
    raw = o.chat.completions.with_raw_response.create(
        model="claude-x", messages=[{"role": "user", "content": "chat over anthropic"}],
        response_format={"type": "json_schema", "json_schema": step},
        tools=[{"type": "function", "function": {"name": "weather", "parameters": CALL}}])
    body = json.loads(claude.last.raw)
    assert list(body["output_config"]["format"]["schema"]["properties"]) == ["reasoning", "answer"]
    assert _orders(body["tools"][0]["input_schema"]) == [["zone", "city"], ["name", "country"]]
    sent = [(raw.headers["x-node-id"], claude.last.raw)]

    raw = mproxy.openai(key, conversation=f"{cid}-r").responses.with_raw_response.create(
        model="gpt-x", input="responses over chat", text={"format": {"type": "json_schema", **step}},
        tools=[{"type": "function", "name": "weather", "parameters": CALL, "strict": False}])
    body = json.loads(upstream.last.raw)
    assert list(body["response_format"]["json_schema"]["schema"]["properties"]) == ["reasoning", "answer"]
    assert _orders(body["tools"][0]["function"]["parameters"]) == [["zone", "city"], ["name", "country"]]
    sent.append((raw.headers["x-node-id"], upstream.last.raw))

    c = anthropic.Anthropic(base_url=f"{mproxy.url}/c/{cid}-m", api_key=key, max_retries=0)
    raw = c.messages.with_raw_response.create(
        model="gpt-x", max_tokens=100, messages=[{"role": "user", "content": "messages over chat"}],
        output_config={"format": {"type": "json_schema", "schema": STEP}},
        tools=[{"name": "weather", "description": "the weather", "input_schema": CALL}])
    body = json.loads(upstream.last.raw)
    assert list(body["response_format"]["json_schema"]["schema"]["properties"]) == ["reasoning", "answer"]
    assert _orders(body["tools"][0]["function"]["parameters"]) == [["zone", "city"], ["name", "country"]]
    sent.append((raw.headers["x-node-id"], upstream.last.raw))
    for node_id, body_sent in sent:
        replay = _replayed(mproxy, key, node_id)
        assert replay.headers["x-request-verified"] == "true" and replay.content == body_sent
        assert b"_bp_" not in body_sent


def test_a_definition_named_properties_keeps_its_order() -> None:
    """A key of ``$defs`` (or ``definitions``) is a name: a definition called "properties" is a
    schema, whose own properties keep the client's order (they were taken for its keywords)."""
    from proxy.key_order import encode_sorted, with_key_order

    inner = {"type": "object", "properties": {"zz": {"type": "string"}, "aa": {"type": "string"}}}
    for defs in ("$defs", "definitions"):
        schema = {"type": "object", "properties": {"p": {"$ref": f"#/{defs}/properties"}}, defs: {"properties": inner}}
        body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        sent = json.loads(encode_sorted({**with_key_order(body), "messages": []}))
        assert list(sent["response_format"]["json_schema"]["schema"][defs]["properties"]["properties"]) == ["zz", "aa"]


def test_a_translation_writes_the_same_bytes_live_and_replayed() -> None:
    """A translated request from a live call's fields (the client's order everywhere) and from its
    replay's (read back from jsonb) is the same bytes -- schemas nested past the recorded depth too,
    whose order only the live call knows -- in each direction between the APIs."""
    import msgspec

    from proxy.dialects import crossing
    from proxy.key_order import MAX_DEPTH, encode_sorted, with_key_order

    deep: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_DEPTH):
        deep = {"type": "object", "properties": {"zz": deep, "aa": {"type": "string"}}}
    schemas = {"step": STEP, "call": CALL, "deep": deep, "odd": {"type": "array", "items": deep}}
    bodies = {
        ("chat", "messages"): {"model": "m", "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": STEP}}, "tools": [{"type": "function", "function": {"name": n, "parameters": s}}
                                                     for n, s in schemas.items()]},
        ("messages", "chat"): {"model": "m", "max_tokens": 9, "output_config": {"format": {
            "type": "json_schema", "schema": STEP}}, "tools": [{"name": n, "input_schema": s} for n, s in schemas.items()]},
        ("responses", "chat"): {"model": "m", "text": {"format": {"type": "json_schema", "name": "s", "schema": STEP}},
                                "tools": [{"type": "function", "name": n, "parameters": s} for n, s in schemas.items()]},
        ("chat", "responses"): {"model": "m", "tools": [{"type": "function", "function": {"name": n, "parameters": s}}
                                                        for n, s in schemas.items()]},
    }
    for (client, upstream), body in bodies.items():
        way = crossing(client, upstream)
        live = with_key_order(json.loads(json.dumps(body)))
        stored = msgspec.json.decode(msgspec.json.Encoder(order="sorted").encode(live))
        written = [encode_sorted({**way.fields(params), "messages": []}) for params in (live, stored)]
        assert written[0] == written[1], (client, upstream)
        assert b'"reasoning":{"type":"string"},"answer"' in written[0] and b'"zone":{"type":"string"},"city"' in written[0]


def test_keywords_said_in_words_are_said_in_one_order(mproxy: Proxy, claude: FakeAnthropic, key: str, cid: str) -> None:
    """Towards Anthropic's structured outputs a keyword its grammar does not enforce is said in the
    description: in sorted order, so ``/request``, reading the schema back from jsonb, writes the
    same words (it wrote them in jsonb's order, the call in the client's: not verified)."""
    schema = {"type": "object", "properties": {"a": {"minLength": 1, "type": "string", "pattern": "^x",
                                                     "not": {"type": "string", "const": "xy"}}},
              "required": ["a"], "additionalProperties": False}
    raw = mproxy.openai(key, conversation=cid).chat.completions.with_raw_response.create(
        model="claude-x", messages=[{"role": "user", "content": "q"}],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": schema}})
    said = json.loads(claude.last.raw)["output_config"]["format"]["schema"]["properties"]["a"]["description"]
    assert said == "{minLength: 1, not: {'const': 'xy', 'type': 'string'}, pattern: ^x}"
    replay = _replayed(mproxy, key, raw.headers["x-node-id"])
    assert replay.headers["x-request-verified"] == "true" and replay.content == claude.last.raw
