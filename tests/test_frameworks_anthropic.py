"""The frameworks' Anthropic sides, unmodified but for their base URL, against the proxy's Messages
API (docs/behaviour.md#the-messages-api): LangChain's ``ChatAnthropic`` (a tool loop, then an edited
question, streamed and not, over a named conversation and under ``/auto``) and pydantic-ai's
``AnthropicModel`` (two turns with a tool, ``message_history``) -- each over an Anthropic upstream
(tests/anthropic_fake.py) and over a chat one (tests/fakes.py: the proxy translates). The frameworks
resend their whole history; what is checked is what the upstream RECEIVED -- read as a list of
plain turns, whichever API it speaks: each question once, every tool result after its call, the
system prompt once, nothing of an edited-away branch -- and the tree stored: one node per call,
holding only what was new, hung where its content goes, the head on the last answer. And a chat
model's reasoning, a thinking block for an Anthropic client: pydantic-ai sends it back as it came
only when it is signed, and Claude never gets it."""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import uuid
from typing import Any

import anthropic
import httpx
import pytest

from tests.anthropic_fake import AReply, FakeAnthropic
from tests.conftest import Proxy
from tests.fakes import FakeUpstream, Reply

# The model names ``mproxy`` routes (tests/conftest.py, three_upstreams): claude-* to the fake
# Anthropic upstream, anything else to the chat one.
MODEL = {"anthropic": "claude-x", "chat": "gpt-x"}


class Upstream:
    """The fake upstream a test's calls reach, scripted and read alike whichever API it speaks."""

    def __init__(self, kind: str, claude: FakeAnthropic, chat: FakeUpstream) -> None:
        self.kind = kind
        self.fake: Any = claude if kind == "anthropic" else chat

    def tools(self, *calls: tuple[str, str, dict[str, Any]], text: str | None = None) -> None:
        """The next answer: tool calls ``(id, name, input)``, after ``text`` if given."""
        if self.kind == "anthropic":
            blocks = [{"type": "text", "text": text}] if text else []
            blocks += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]
            self.fake.enqueue(AReply(content=blocks, stop_reason="tool_use"))
        else:
            self.fake.enqueue(Reply(content=text, tool_calls=[
                {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for i, n, a in calls]))

    def says(self, text: str) -> None:
        if self.kind == "anthropic":
            self.fake.enqueue(AReply(content=[{"type": "text", "text": text}]))
        else:
            self.fake.enqueue(Reply(content=text))

    @property
    def received(self) -> list[list[tuple[Any, ...]]]:
        """Every turn request the upstream received, as plain turns (``turns``)."""
        if self.kind == "anthropic":
            return [anthropic_turns(r.body) for r in self.fake.calls]
        return [chat_turns(r.body) for r in self.fake.turn_requests]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in (self.fake.calls if self.kind == "anthropic" else self.fake.turn_requests)]


# -- what a model reads, whichever API carried it --------------------------------------------------
# ("system", text) | ("user", text) | ("assistant", text, ((id, name, input), ...)) | ("tool", id, text)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text").strip()


def anthropic_turns(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if body.get("system"):
        out.append(("system", _text(body["system"])))
    for m in body["messages"]:
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        if m["role"] == "assistant":
            calls = tuple((b["id"], b["name"], b["input"]) for b in content if b["type"] == "tool_use")
            out.append(("assistant", _text(content), calls))
            continue
        for b in content:
            if b["type"] == "tool_result":
                out.append(("tool", b["tool_use_id"], _text(b.get("content"))))
            elif b["type"] == "text":
                out.append(("user", b["text"].strip()))
            else:
                out.append(("user", b["type"]))
    return out


def chat_turns(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for m in body["messages"]:
        if m["role"] == "assistant":
            calls = tuple((c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                          for c in m.get("tool_calls") or ())
            out.append(("assistant", _text(m.get("content")), calls))
        elif m["role"] == "tool":
            out.append(("tool", m["tool_call_id"], _text(m["content"])))
        else:
            out.append((m["role"], _text(m["content"])))
    return out


def assert_well_formed(turns: list[tuple[Any, ...]]) -> None:
    """At most one system prompt, first; every question once; every tool call answered right after
    it, once, and no tool result without its call."""
    assert [t[0] for t in turns].count("system") <= 1 and all(t[0] != "system" for t in turns[1:]), turns
    questions = [t[1] for t in turns if t[0] == "user"]
    assert len(questions) == len(set(questions)), turns
    pending: list[str] = []
    for t in turns:
        if t[0] == "tool":
            assert t[1] in pending, turns  # a result after its own call
            pending.remove(t[1])
        else:
            assert not pending, turns  # every call answered before the conversation goes on
            if t[0] == "assistant":
                pending = [c[0] for c in t[2]]
    assert not pending, turns


class Recorder:
    """The Messages request bodies a framework sends and the response headers it gets (event
    hooks on its own httpx client)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.statuses: list[int] = []

    def _request(self, request: Any) -> None:
        if request.url.path.endswith("/messages"):
            self.sent.append(json.loads(request.content))

    async def _arequest(self, request: Any) -> None:
        self._request(request)

    def hooks(self) -> dict[str, list[Any]]:
        return {"request": [self._request], "response": [self._response]}

    def async_hooks(self) -> dict[str, list[Any]]:
        return {"request": [self._arequest], "response": [self._aresponse]}

    def _response(self, response: Any) -> None:
        if response.request.url.path.endswith("/messages"):
            self.statuses.append(response.status_code)
            self.headers.append({k.lower(): v for k, v in response.headers.items()})

    async def _aresponse(self, response: Any) -> None:
        self._response(response)

    @property
    def modes(self) -> list[str]:
        return [h.get("x-context-mode", "") for h in self.headers]

    @property
    def nodes(self) -> list[str]:
        return [h["x-node-id"] for h in self.headers]

    @property
    def conversation(self) -> str:
        ids = {h.get("x-conversation-id") for h in self.headers}
        assert len(ids) == 1, ids  # every call landed in one conversation
        return ids.pop()  # type: ignore[return-value]


def _blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m["content"], str) else m
            for m in messages]


def assert_native_as_sent(up: Upstream, recorder: Recorder) -> None:
    """An Anthropic upstream gets each call's messages as the framework sent them, block for block
    (the fragments the proxy stores put back together; a matched answer as the upstream gave it,
    its text in a block where the framework resends a string), and its other fields as they came."""
    if up.kind != "anthropic":
        return
    assert len(up.bodies) == len(recorder.sent)
    for got, sent in zip(up.bodies, recorder.sent, strict=True):
        assert _blocks(got["messages"]) == _blocks(sent["messages"])
        assert {k: v for k, v in got.items() if k != "messages"} == {k: v for k, v in sent.items() if k != "messages"}


def a_line_of_four(proxy: Proxy, key: str, recorder: Recorder) -> list[dict[str, Any]]:
    """The recorded calls' conversation, matched in full each time: four nodes in a line, the head
    on the last, each holding only what was new (the system prompt and the question, then one
    message each). Returns the nodes, root first."""
    assert recorder.modes == ["full"] * 4
    nodes, head = tree(proxy, key, recorder.conversation)
    line = [nodes[n] for n in recorder.nodes]
    assert len(nodes) == 4 and head == line[-1]["id"]
    assert [n["parent_id"] for n in line] == [None, *(n["id"] for n in line[:-1])]
    assert [len(n["sent"]) for n in line] == [2, 1, 1, 1]
    return line


def tree(proxy: Proxy, key: str, cid: str) -> tuple[dict[str, dict[str, Any]], str]:
    """The conversation's nodes by id (the admin API's whole node, ``sent`` and ``parent_id`` among
    its fields) and its head."""
    admin = httpx.Client(base_url=proxy.url, headers={"x-api-key": key}, timeout=30)
    with admin:
        conv = admin.get(f"/admin/conversations/{cid}")
        assert conv.status_code == 200, conv.text
        listed = admin.get(f"/admin/conversations/{cid}/tree")
        assert listed.status_code == 200, listed.text
        nodes = {n["id"]: admin.get(f"/admin/nodes/{n['id']}").json() for n in listed.json()["data"]}
    return nodes, conv.json()["head_node_id"]


# -- LangChain: ChatAnthropic ----------------------------------------------------------------------

SYSTEM = "You answer weather questions."
PARIS = ("weather", {"city": "Paris"})
ROME = ("weather", {"city": "Rome"})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("where", ["conversation", "auto"])
@pytest.mark.parametrize("api", ["anthropic", "chat"])
def test_langchain_chatanthropic_tool_loop(mproxy: Proxy, claude: FakeAnthropic, upstream: FakeUpstream, key: str,
                                           monkeypatch: pytest.MonkeyPatch, api: str, where: str,
                                           stream: bool) -> None:
    """A question, two parallel tool calls, their results, the answer; a second question; then
    the second question edited (the app resends the history with it changed): a branch, whose
    request holds nothing of the question it replaces. Named conversation: the JSON calls by the
    base URL ``/c/<id>`` with ``X-Context-Mode: full`` (the README's set-up), the streamed ones
    by ``X-Conversation-Id`` alone -- delta mode, which takes the resent history for what it is
    once it holds an answer (the safety net)."""
    import langchain_anthropic.chat_models as lc
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    recorder = Recorder()

    def recording_client(*, base_url: str | None, timeout: Any = None, anthropic_proxy: str | None = None) -> Any:
        return anthropic.DefaultHttpxClient(base_url=base_url or "", timeout=timeout or 30,
                                            event_hooks=recorder.hooks())

    monkeypatch.setattr(lc, "_get_default_httpx_client", recording_client)

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"21 C in {city}"

    cid = f"lc-{uuid.uuid4().hex[:10]}"
    base, headers = {
        ("conversation", False): (f"{mproxy.url}/c/{cid}", {"X-Context-Mode": "full"}),
        ("conversation", True): (mproxy.url, {"X-Conversation-Id": cid}),
    }.get((where, stream), (f"{mproxy.url}/auto", {}))
    llm = lc.ChatAnthropic(model=MODEL[api], base_url=base, api_key=key, max_retries=0, max_tokens=200,
                           default_headers=headers).bind_tools([weather])
    up = Upstream(api, claude, upstream)

    def ask(messages: list[Any]) -> AIMessage:
        if not stream:
            return llm.invoke(messages)
        return functools.reduce(operator.add, llm.stream(messages))

    up.tools(("toolu_p1", *PARIS), ("toolu_r1", *ROME), text="Let me look both up.")
    up.says("Paris 21 C, Rome 21 C.")
    up.says("Tomorrow too.")
    up.says("Cooler in Oslo.")
    messages: list[Any] = [SystemMessage(SYSTEM), HumanMessage("Weather in Paris and Rome?")]
    ai = ask(messages)
    assert [(c["id"], c["name"], c["args"]) for c in ai.tool_calls] == [("toolu_p1", *PARIS), ("toolu_r1", *ROME)]
    messages.append(ai)
    messages += [ToolMessage(weather.invoke(c["args"]), tool_call_id=c["id"]) for c in ai.tool_calls]
    final = ask(messages)
    assert final.text == "Paris 21 C, Rome 21 C."
    messages.append(final)
    assert ask([*messages, HumanMessage("And tomorrow?")]).text == "Tomorrow too."
    assert ask([*messages, HumanMessage("And in Oslo?")]).text == "Cooler in Oslo."  # the question edited
    assert recorder.statuses == [200, 200, 200, 200]

    # what the upstream received: the history once, in order, the calls' results after them
    calls = (("toolu_p1", *PARIS), ("toolu_r1", *ROME))
    history = [("system", SYSTEM), ("user", "Weather in Paris and Rome?"),
               ("assistant", "Let me look both up.", calls),
               ("tool", "toolu_p1", "21 C in Paris"), ("tool", "toolu_r1", "21 C in Rome"),
               ("assistant", "Paris 21 C, Rome 21 C.", ())]
    received = up.received
    assert received == [history[:2], history[:5], [*history, ("user", "And tomorrow?")],
                        [*history, ("user", "And in Oslo?")]]  # not "And tomorrow?" nor its answer
    for turns in received:
        assert_well_formed(turns)
    assert_native_as_sent(up, recorder)
    assert all(b["model"] == MODEL[api] for b in up.bodies)

    # what was stored: one node per call holding what was new, the edit a sibling of the question
    cid = recorder.conversation
    assert where != "auto" or cid.startswith("auto-")
    assert recorder.modes == (["delta", "full", "full", "full"] if (where, stream) == ("conversation", True)
                              else ["full"] * 4)
    nodes, head = tree(mproxy, key, cid)
    first, tools_answered, tomorrow, oslo = (nodes[n] for n in recorder.nodes)
    assert len(nodes) == 4 and head == oslo["id"]
    assert {n["api"] for n in nodes.values()} == {"messages"}
    assert {(n["kind"], n["status"]) for n in nodes.values()} == {("turn", "success")}
    assert first["parent_id"] is None
    assert tools_answered["parent_id"] == first["id"]
    assert tomorrow["parent_id"] == oslo["parent_id"] == tools_answered["id"]
    assert [m["role"] for m in first["sent"]] == ["system", "user"]
    assert [[b["tool_use_id"] for b in m["content"]] for m in tools_answered["sent"]] == [["toolu_p1"], ["toolu_r1"]]
    assert [m["content"] for m in tomorrow["sent"]] == ["And tomorrow?"]
    assert [m["content"] for m in oslo["sent"]] == ["And in Oslo?"]


# -- pydantic-ai: AnthropicModel -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["conversation", "auto"])
@pytest.mark.parametrize("api", ["anthropic", "chat"])
def test_pydantic_ai_anthropic_two_turns_with_a_tool(mproxy: Proxy, claude: FakeAnthropic, upstream: FakeUpstream,
                                                     key: str, api: str, where: str) -> None:
    """Two runs of an agent with a tool, the second given the first's messages
    (``message_history``) and streamed (``run_stream``): four calls, one line of nodes. Named
    conversation: ``/c/<id>`` with ``X-Context-Mode: full`` on the provider's httpx client."""
    import httpx2
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    cid = f"pyd-{uuid.uuid4().hex[:10]}"
    recorder = Recorder()
    up = Upstream(api, claude, upstream)
    up.tools(("toolu_1", *PARIS))
    up.says("It is 21 C in Paris.")
    up.tools(("toolu_2", *ROME))
    up.says("Rome is 21 C too.")

    async def conversation() -> tuple[str, str]:
        base, headers = (f"{mproxy.url}/c/{cid}", {"X-Context-Mode": "full"}) if where == "conversation" \
            else (f"{mproxy.url}/auto", {})
        async with httpx2.AsyncClient(headers=headers, timeout=30,
                                      event_hooks=recorder.async_hooks()) as http:
            provider = AnthropicProvider(api_key=key, base_url=base, http_client=http)
            agent = Agent(AnthropicModel(MODEL[api], provider=provider), instructions=SYSTEM)

            @agent.tool_plain
            def weather(city: str) -> str:
                """The weather in a city."""
                return f"21 C in {city}"

            first = await agent.run("Weather in Paris?")
            async with agent.run_stream("And in Rome?", message_history=first.all_messages()) as second:
                output = await second.get_output()
            return first.output, output

    assert asyncio.run(conversation()) == ("It is 21 C in Paris.", "Rome is 21 C too.")
    assert recorder.statuses == [200, 200, 200, 200]

    paris = [("system", SYSTEM), ("user", "Weather in Paris?"), ("assistant", "", (("toolu_1", *PARIS),)),
             ("tool", "toolu_1", "21 C in Paris"), ("assistant", "It is 21 C in Paris.", ())]
    rome = [("user", "And in Rome?"), ("assistant", "", (("toolu_2", *ROME),)), ("tool", "toolu_2", "21 C in Rome")]
    received = up.received
    assert received == [paris[:2], paris[:4], [*paris, *rome[:1]], [*paris, *rome]]
    for turns in received:
        assert_well_formed(turns)
    assert_native_as_sent(up, recorder)

    line = a_line_of_four(mproxy, key, recorder)
    assert {(n["api"], n["kind"], n["status"]) for n in line} == {("messages", "turn", "success")}


@pytest.mark.parametrize("where", ["conversation", "auto"])
def test_pydantic_ai_anthropic_over_a_reasoning_chat_model(mproxy: Proxy, upstream: FakeUpstream, key: str,
                                                           where: str) -> None:
    """A chat model that reasons (``reasoning_content``: DeepSeek's, Qwen's ...) behind pydantic-ai's
    AnthropicModel. pydantic-ai sends a thinking block back natively only when it is signed; an
    unsigned one it rewrites as text in a user turn (``<assistant_thinking>``) with a framing
    paragraph added to the system prompt. The proxy's thinking blocks for chat reasoning had an
    empty signature: every later call then carried that rewritten history -- the model read its
    own reasoning as the user's words -- and matched nothing stored, so each call started a new
    conversation under /auto (a new root under /c/<id>) holding everything again. They carry a
    signature of the proxy's own now, JSON and streamed alike, and the history comes back as it
    was answered."""
    import httpx2
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel, AnthropicModelSettings
    from pydantic_ai.providers.anthropic import AnthropicProvider

    cid = f"pyd-think-{uuid.uuid4().hex[:10]}"
    recorder = Recorder()
    upstream.enqueue(Reply(content=None, reasoning="Paris: look it up.", tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]),
        Reply(content="It is 21 C in Paris.", reasoning="The tool said 21."),
        Reply(content="Rome is 21 C too.", reasoning="Same as Paris."),
        Reply(content="You are welcome.", reasoning="A thank-you."))

    async def conversation() -> None:
        base, headers = (f"{mproxy.url}/c/{cid}", {"X-Context-Mode": "full"}) if where == "conversation" \
            else (f"{mproxy.url}/auto", {})
        async with httpx2.AsyncClient(headers=headers, timeout=30, event_hooks=recorder.async_hooks()) as http:
            model = AnthropicModel("gpt-x", provider=AnthropicProvider(api_key=key, base_url=base, http_client=http))
            agent = Agent(model, instructions=SYSTEM, model_settings=AnthropicModelSettings(
                anthropic_thinking={"type": "enabled", "budget_tokens": 1024}))

            @agent.tool_plain
            def weather(city: str) -> str:
                """The weather in a city."""
                return f"21 C in {city}"

            first = await agent.run("Weather in Paris?")
            async with agent.run_stream("And in Rome?", message_history=first.all_messages()) as second:
                assert await second.get_output() == "Rome is 21 C too."
            third = await agent.run("Thanks!", message_history=second.all_messages())  # (the streamed answer resent)
            assert third.output == "You are welcome."

    asyncio.run(conversation())
    assert recorder.statuses == [200, 200, 200, 200]
    for sent in recorder.sent:  # the history as answered: its thinking blocks signed, none rewritten as text
        assert sent["system"] == [{"type": "text", "text": SYSTEM}] or sent["system"] == SYSTEM, sent["system"]
        assert "assistant_thinking" not in json.dumps(sent["messages"])
    received = [chat_turns(r.body) for r in upstream.turn_requests]
    paris = [("system", SYSTEM), ("user", "Weather in Paris?"), ("assistant", "", (("call_1", *PARIS),)),
             ("tool", "call_1", "21 C in Paris"), ("assistant", "It is 21 C in Paris.", ())]
    rome = [("user", "And in Rome?"), ("assistant", "Rome is 21 C too.", ())]
    assert received == [paris[:2], paris[:4], [*paris, *rome[:1]], [*paris, *rome, ("user", "Thanks!")]]

    a_line_of_four(mproxy, key, recorder)


@pytest.mark.parametrize("where", ["nowhere", "conversation"])
def test_langchain_a_chat_models_reasoning_never_reaches_claude(mproxy: Proxy, claude: FakeAnthropic,
                                                                upstream: FakeUpstream, key: str, where: str) -> None:
    """LangChain's ChatAnthropic asks a chat model that reasons, then Claude, with the first answer
    -- its thinking block, signed by the proxy -- in the history. Claude gets the answer's text and
    not the thinking, which no Anthropic upstream would take back: in a named conversation (the
    stored answer goes back to its producer only) and in a call that names none (passed through
    as the client sent it, but for the proxy's own pieces)."""
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage

    cid = f"lc-think-{uuid.uuid4().hex[:10]}"
    base, headers = (f"{mproxy.url}/c/{cid}", {"X-Context-Mode": "full"}) if where == "conversation" else (mproxy.url, {})

    def llm(model: str) -> Any:
        return ChatAnthropic(model=model, base_url=base, api_key=key, max_retries=0, max_tokens=2000,
                             default_headers=headers, thinking={"type": "enabled", "budget_tokens": 1024})

    upstream.enqueue(Reply(content="42", reasoning="Six times seven."))
    history: list[Any] = [HumanMessage("The answer?")]
    answer = llm("gpt-x").invoke(history)
    thinking, text = answer.content
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Six times seven." and thinking["signature"]
    assert text == {"type": "text", "text": "42"}
    claude.enqueue(AReply(content=[{"type": "text", "text": "Yes."}]))
    assert llm("claude-x").invoke([*history, answer, HumanMessage("Sure?")]).text == "Yes."
    assert claude.last.body["messages"] == [
        {"role": "user", "content": "The answer?"},
        {"role": "assistant", "content": [{"type": "text", "text": "42"}]},
        {"role": "user", "content": "Sure?"}]
