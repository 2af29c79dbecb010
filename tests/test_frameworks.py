"""Real frameworks, unmodified but for their base URL, resending their whole history as they do:
LangChain, the OpenAI Agents SDK and LiteLLM (as a client) through ``/auto/v1``, pydantic-ai
through ``/c/<id>/v1`` with ``X-Context-Mode: full`` -- the set-ups the README gives. Each test records what
the framework sent (an httpx event hook on its own client) and asserts that the upstream received
exactly that, by meaning, once -- no history appended twice -- and that the calls were stored as a
line of nodes holding only what was new."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from typing import Any

import httpx
import pytest

from storage.transcript import canonical

from .fakes import Reply
from .helpers import tool_call

WEATHER = tool_call("call_w1", "weather", '{"city":"Paris"}')


def meaning(messages: list[dict[str, Any]]) -> list[Any]:
    """Messages by meaning, system messages first (the system rule) -- what a model would see."""
    system = [[m["role"], m.get("content")] for m in messages if m.get("role") in ("system", "developer")]
    return system + [canonical(m) for m in messages if canonical(m) is not None]


class Recorder:
    """Records the chat request bodies a framework's httpx client sends, and the conversation ids
    the answers name."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.conversations: list[str] = []

    def _hook(self, request: httpx.Request) -> None:
        if request.url.path.endswith(("/chat/completions", "/responses")):
            self.sent.append(json.loads(request.content))

    def _response(self, response: httpx.Response) -> None:
        if "x-conversation-id" in response.headers:
            self.conversations.append(response.headers["x-conversation-id"])

    async def _ahook(self, request: httpx.Request) -> None:
        self._hook(request)

    async def _aresponse(self, response: httpx.Response) -> None:
        self._response(response)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self._hook], "response": [self._response]}, timeout=30)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"request": [self._ahook], "response": [self._aresponse]}, timeout=30)

    @property
    def conversation(self) -> str:
        assert len(set(self.conversations)) == 1, self.conversations  # every call landed in one conversation
        return self.conversations[0]


def assert_received_what_was_sent(upstream, recorder: Recorder) -> None:
    received = upstream.turn_requests[-len(recorder.sent):]
    assert len(received) == len(recorder.sent)
    for sent, got in zip(recorder.sent, received, strict=True):
        assert meaning(got.messages) == meaning(sent["messages"])


def stored_line(db, cid: str) -> list[Any]:
    rows = db.fetch("SELECT id, parent_id, sent FROM nodes WHERE conversation_id = $1 ORDER BY created_at", cid)
    for prev, row in itertools.pairwise(rows):
        assert row["parent_id"] == prev["id"]  # one line: every call hangs under the previous one
    return [r["sent"] for r in rows]


def test_langchain_chatopenai_with_a_tool_loop_through_auto(proxy, upstream, key, db):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"21 C in {city}"

    recorder = Recorder()
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0,
                     http_client=recorder.client()).bind_tools([weather])
    upstream.enqueue(Reply(content=None, tool_calls=[WEATHER]), Reply(content="It is 21 C in Paris."),
                     Reply(content="Tomorrow too."))
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    ai = llm.invoke(messages)
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]))
    messages.append(llm.invoke(messages))
    messages.append(HumanMessage("And tomorrow?"))
    assert llm.invoke(messages).content == "Tomorrow too."
    assert [len(r.messages) for r in upstream.turn_requests[-3:]] == [1, 3, 5]  # not 1, 4, 9
    assert_received_what_was_sent(upstream, recorder)
    assert [len(sent) for sent in stored_line(db, recorder.conversation)] == [1, 1, 1]


def test_the_agents_sdk_with_a_function_tool_over_three_turns(proxy, upstream, key, db):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    recorder = Recorder()

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"21 C in {city}"

    async def conversation() -> None:
        client = AsyncOpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0,
                             http_client=recorder.async_client())
        agent = Agent(name="forecaster", instructions="You answer weather questions.", tools=[weather],
                      model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))
        items: list[Any] = []
        for i, city in enumerate(["Paris", "Rome", "Oslo"]):
            upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}", "weather", json.dumps({"city": city}))]),
                             Reply(content=f"It is 21 C in {city}."))
            result = await Runner.run(agent, [*items, {"role": "user", "content": f"Weather in {city}?"}])
            assert result.final_output == f"It is 21 C in {city}."
            items = result.to_input_list()

    asyncio.run(conversation())
    assert len(recorder.sent) == 6
    assert [len(r.messages) for r in upstream.turn_requests[-6:]] == [2, 4, 6, 8, 10, 12]  # system + the history
    assert_received_what_was_sent(upstream, recorder)
    line = stored_line(db, recorder.conversation)
    assert len(line) == 6 and line[0][0]["role"] == "system" and all(len(sent) == 1 for sent in line[1:])


def test_pydantic_ai_over_two_turns(proxy, upstream, key, db):
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    cid = f"pyd-{uuid.uuid4().hex[:8]}"
    recorder = Recorder()

    async def conversation() -> None:
        client = AsyncOpenAI(base_url=f"{proxy.url}/c/{cid}/v1", api_key=key, max_retries=0,
                             default_headers={"X-Context-Mode": "full"}, http_client=recorder.async_client())
        agent = Agent(OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client)),
                      instructions="Be brief.")
        upstream.enqueue(Reply(content="Paris."), Reply(content="About 2.1 million."))
        first = await agent.run("Capital of France?")
        second = await agent.run("How many people live there?", message_history=first.all_messages())
        assert second.output == "About 2.1 million."

    asyncio.run(conversation())
    assert [len(r.messages) for r in upstream.turn_requests[-2:]] == [2, 4]
    assert_received_what_was_sent(upstream, recorder)
    assert len(stored_line(db, cid)) == 2


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_litellm_as_a_client(proxy, upstream, key, db):
    import litellm

    base = f"{proxy.url}/auto/v1"
    upstream.enqueue(Reply(content=None, tool_calls=[WEATHER]), Reply(content="21 C."))
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = litellm.completion(model="openai/gpt-4o-mini", api_base=base, api_key=key, messages=messages, tools=tools)
    first_headers = first._hidden_params["additional_headers"]
    assert first_headers["llm_provider-x-context-mode"] == "full"
    cid = first_headers["llm_provider-x-conversation-id"]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": "call_w1", "content": "21 C"})
    second = litellm.completion(model="openai/gpt-4o-mini", api_base=base, api_key=key, messages=messages, tools=tools)
    headers = second._hidden_params["additional_headers"]
    assert headers["llm_provider-x-context-matched"] == "2" and headers["llm_provider-x-conversation-id"] == cid
    assert len(upstream.last.messages) == 3
    assert meaning(upstream.last.messages) == meaning(messages)
    assert [len(sent) for sent in stored_line(db, cid)] == [1, 1]


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_litellm_claude_models_under_auto(mproxy, claude, key):
    """The README's LiteLLM line for Claude models: ``api_base=".../auto"`` -- LiteLLM adds
    ``/v1/messages`` (so ``.../auto/v1`` would call ``.../auto/v1/v1/messages``, which is passed
    through unstored: found driving mini-swe-agent, whose Claude models go through LiteLLM)."""
    import litellm

    from .anthropic_fake import AReply

    claude.enqueue(AReply(content=[{"type": "text", "text": "Look."}, {"type": "tool_use", "id": "toolu_1",
                                   "name": "bash", "input": {"command": "ls"}}], stop_reason="tool_use"),
                   AReply(content=[{"type": "text", "text": "Done."}]))
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages: list[Any] = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": "List it."}]
    first = litellm.completion(model="anthropic/claude-x", api_base=f"{mproxy.url}/auto", api_key=key,
                               messages=messages, tools=tools, max_tokens=100)
    cid = first._hidden_params["additional_headers"]["llm_provider-x-conversation-id"]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"})
    second = litellm.completion(model="anthropic/claude-x", api_base=f"{mproxy.url}/auto", api_key=key,
                                messages=messages, tools=tools, max_tokens=100)
    assert second.choices[0].message.content == "Done."
    assert second._hidden_params["additional_headers"]["llm_provider-x-conversation-id"] == cid
    assert [r.path for r in claude.calls] == ["/v1/messages", "/v1/messages"]
    assert [m["role"] for m in claude.last.body["messages"]] == ["user", "assistant", "user"]
    assert [len(sent) for sent in stored_line(mproxy.db, cid)] == [2, 1]  # (the system prompt, the question; the result)


@pytest.fixture(autouse=True)
def _quiet_litellm(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download


def test_the_agents_sdk_default_responses_model(proxy, upstream, key, db):
    """The Agents SDK's default model speaks the Responses API: over several turns chained by
    previous_response_id (a named conversation), and resending its input list (/auto/v1)."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"21 C in {city}"

    cid = f"agents-resp-{uuid.uuid4().hex[:8]}"

    async def chained() -> list[str]:
        client = AsyncOpenAI(base_url=f"{proxy.url}/c/{cid}/v1", api_key=key, max_retries=0)
        agent = Agent(name="forecaster", instructions="You answer weather questions.", tools=[weather],
                      model=OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client))
        previous, outputs = None, []
        for i, city in enumerate(["Paris", "Rome", "Oslo"]):
            upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_{i}", "weather", json.dumps({"city": city}))]),
                             Reply(content=f"It is 21 C in {city}."))
            result = await Runner.run(agent, f"Weather in {city}?", previous_response_id=previous)
            outputs.append(result.final_output)
            previous = result.last_response_id
        return outputs

    assert asyncio.run(chained()) == ["It is 21 C in Paris.", "It is 21 C in Rome.", "It is 21 C in Oslo."]
    # six calls, one line: each round hangs under the previous one; the upstream saw each message once
    received = upstream.turn_requests[-6:]
    assert [len(r.messages) for r in received] == [2, 4, 6, 8, 10, 12]
    assert received[-1].messages[0] == {"role": "system", "content": "You answer weather questions."}
    rows = db.fetch("SELECT api FROM nodes WHERE conversation_id = $1", cid)
    assert len(rows) == 6 and {r["api"] for r in rows} == {"responses"}
    stored_line(db, cid)

    recorder = Recorder()

    async def resending() -> None:
        client = AsyncOpenAI(base_url=f"{proxy.url}/auto/v1", api_key=key, max_retries=0, http_client=recorder.async_client())
        agent = Agent(name="forecaster", instructions="You answer weather questions.", tools=[weather],
                      model=OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client))
        items: list[Any] = []
        for i, city in enumerate(["Lima", "Quito"]):
            upstream.enqueue(Reply(content=None, tool_calls=[tool_call(f"call_r{i}", "weather", json.dumps({"city": city}))]),
                             Reply(content=f"It is 21 C in {city}."))
            result = await Runner.run(agent, [*items, {"role": "user", "content": f"Weather in {city}?"}])
            items = result.to_input_list()

    asyncio.run(resending())
    assert [len(r.messages) for r in upstream.turn_requests[-4:]] == [2, 4, 6, 8]
    assert len(set(recorder.conversations)) == 1
    line = stored_line(db, recorder.conversation)
    assert len(line) == 4 and all(len([i for i in sent if i.get("role") != "system"]) <= 2 for sent in line)
