// Drives Branchpoint with the OpenAI Agents SDK for JS (@openai/agents), unmodified, at /auto/v1:
// an Agent with a function tool, `run` (the tool round), a streamed run resending the history
// (MODEL_API: "responses", its default OpenAIResponsesModel, or "chat", its
// OpenAIChatCompletionsModel); with SESSION=conversations, three runs keeping their history in an
// OpenAIConversationsSession. Prints what it saw as one JSON object (tests/test_node_sdk.py).
import { Agent, OpenAIChatCompletionsModel, OpenAIConversationsSession, OpenAIResponsesModel, run, setTracingDisabled,
         tool } from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";

setTracingDisabled(true); // (nothing leaves the machine)
const { BASE_URL, API_KEY, MODEL_API, SESSION } = process.env;
const calls = [];
const recording = async (url, init) => {
  const response = await fetch(url, init);
  const h = (name) => response.headers.get(name);
  calls.push({ path: new URL(String(url)).pathname, method: init?.method ?? "GET", status: response.status,
               conversation: h("x-conversation-id"), node: h("x-node-id"), parent: h("x-parent-node-id"),
               mode: h("x-context-mode"), matched: h("x-context-matched") });
  return response;
};
const client = new OpenAI({ baseURL: `${BASE_URL}/auto/v1`, apiKey: API_KEY, maxRetries: 0, fetch: recording });
const model = MODEL_API === "chat" ? new OpenAIChatCompletionsModel(client, "gpt-4o-mini")
                                   : new OpenAIResponsesModel(client, "gpt-4o-mini");
const weather = tool({ name: "weather", description: "The weather in a city", parameters: z.object({ city: z.string() }),
                       execute: async ({ city }) => `21 C in ${city}` });
const agent = new Agent({ name: "Weather", instructions: "You answer weather questions.", model, tools: [weather] });

if (SESSION === "conversations") {
  const session = new OpenAIConversationsSession({ client });
  const answers = [];
  for (const question of ["Weather in Paris?", "And tomorrow?", "And the day after?"]) {
    answers.push((await run(agent, question, { session })).finalOutput);
  }
  const items = await session.getItems();
  const text = (i) => i.type === "message" ? (typeof i.content === "string" ? i.content : i.content.map((p) => p.text).join(""))
                                           : i.type;
  console.log(JSON.stringify({ answers, conversation: await session.getSessionId(), items: items.map(text), calls }));
} else {
  const first = await run(agent, "What is the weather in Paris?");
  const streamed = await run(agent, [...first.history, { role: "user", content: "And tomorrow?" }], { stream: true });
  const events = new Set();
  for await (const event of streamed) events.add(event.type === "raw_model_stream_event" ? event.data.type : event.type);
  await streamed.completed;
  console.log(JSON.stringify({
    first: first.finalOutput, second: streamed.finalOutput, events: [...events],
    usage: [first, streamed].flatMap((r) => r.rawResponses.map((x) => x.usage.totalTokens)), calls,
  }));
}
