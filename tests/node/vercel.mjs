// Drives Branchpoint at /auto/v1 with the Vercel AI SDK: a tool loop and a follow-up turn, resending
// the whole history as the SDK does. PROVIDER_API=chat uses the OpenAI chat-completions provider
// (provider.chat(model)); PROVIDER_API=responses the OpenAI default one (provider(model): the
// Responses API); PROVIDER_API=anthropic the Anthropic provider (the Messages API; MODEL picks the
// upstream), its follow-up streamed. Prints what it sent (recorded by a fetch wrapper) and the
// response headers it saw (tests/test_node_sdk.py checks it).
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const { BASE_URL, API_KEY, PROVIDER_API, MODEL } = process.env;
const endpoint = { responses: "/responses", anthropic: "/messages" }[PROVIDER_API] ?? "/chat/completions";
const sent = [];
const options = {
  baseURL: `${BASE_URL}/auto/v1`,
  apiKey: API_KEY,
  fetch: async (url, init) => {
    if (String(url).endsWith(endpoint)) sent.push(JSON.parse(init.body));
    return fetch(url, init);
  },
};
const model = PROVIDER_API === "anthropic" ? createAnthropic(options)(MODEL)
  : PROVIDER_API === "responses" ? createOpenAI(options)("gpt-4o-mini") : createOpenAI(options).chat("gpt-4o-mini");
const weather = tool({
  description: "The weather in a city",
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => `21 C in ${city}`,
});

const messages = [{ role: "user", content: "What is the weather in Paris?" }];
const first = await generateText({
  model, messages, tools: { weather }, stopWhen: stepCountIs(5), maxRetries: 0,
});
messages.push(...first.responseMessages, { role: "user", content: "And tomorrow?" });
let second;
if (PROVIDER_API === "anthropic") {
  const stream = streamText({ model, messages, tools: { weather }, maxRetries: 0, onError: ({ error }) => { throw error; } });
  second = { text: await stream.text, response: await stream.response };
} else {
  second = await generateText({ model, messages, tools: { weather }, maxRetries: 0 });
}

const headers = (r) => ({
  conversation: r.response.headers["x-conversation-id"],
  node: r.response.headers["x-node-id"], parent: r.response.headers["x-parent-node-id"],
  mode: r.response.headers["x-context-mode"], matched: r.response.headers["x-context-matched"],
});
console.log(JSON.stringify({ sent, first: { text: first.text, ...headers(first) }, second: { text: second.text, ...headers(second) } }));
