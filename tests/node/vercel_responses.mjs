// Drives Branchpoint at /auto/v1 with the Vercel AI SDK's default provider (provider(model): the
// Responses API): a tool loop, then a follow-up resending the whole history. Prints what it sent
// and the headers it saw (tests/test_node_sdk.py checks it).
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";

const { BASE_URL, API_KEY } = process.env;
const sent = [];
const provider = createOpenAI({
  baseURL: `${BASE_URL}/auto/v1`,
  apiKey: API_KEY,
  fetch: async (url, init) => {
    if (String(url).endsWith("/responses")) sent.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const weather = tool({
  description: "The weather in a city",
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => `21 C in ${city}`,
});

const messages = [{ role: "user", content: "What is the weather in Paris?" }];
const first = await generateText({
  model: provider("gpt-4o-mini"), messages, tools: { weather }, stopWhen: stepCountIs(5), maxRetries: 0,
});
messages.push(...first.responseMessages, { role: "user", content: "And tomorrow?" });
const second = await generateText({ model: provider("gpt-4o-mini"), messages, tools: { weather }, maxRetries: 0 });

const headers = (r) => ({
  conversation: r.response.headers["x-conversation-id"], node: r.response.headers["x-node-id"],
  mode: r.response.headers["x-context-mode"], matched: r.response.headers["x-context-matched"],
});
console.log(JSON.stringify({ sent, first: { text: first.text, ...headers(first) }, second: { text: second.text, ...headers(second) } }));
