// Drives Branchpoint with the official openai Node package: a turn, a streamed turn, and an edit
// via X-Parent-Node-Id. Prints what it saw as one JSON object (tests/test_node_sdk.py checks it).
import OpenAI from "openai";

const { BASE_URL, API_KEY, CONVERSATION } = process.env;
const client = new OpenAI({ baseURL: `${BASE_URL}/c/${CONVERSATION}/v1`, apiKey: API_KEY, maxRetries: 0 });

const first = await client.chat.completions
  .create({ model: "gpt-4o-mini", messages: [{ role: "user", content: "node turn one" }] })
  .withResponse();

const stream = await client.chat.completions
  .create({ model: "gpt-4o-mini", stream: true, messages: [{ role: "user", content: "node turn two" }] })
  .withResponse();
let streamed = "";
for await (const chunk of stream.data) {
  streamed += chunk.choices[0]?.delta?.content ?? "";
}

const edit = await client.chat.completions
  .create(
    { model: "gpt-4o-mini", messages: [{ role: "user", content: "node turn two, edited" }] },
    { headers: { "X-Parent-Node-Id": first.response.headers.get("x-node-id") } },
  )
  .withResponse();

console.log(JSON.stringify({
  first: { node: first.response.headers.get("x-node-id"), text: first.data.choices[0].message.content },
  second: { node: stream.response.headers.get("x-node-id"), parent: stream.response.headers.get("x-parent-node-id"), text: streamed },
  edit: { node: edit.response.headers.get("x-node-id"), parent: edit.response.headers.get("x-parent-node-id"), text: edit.data.choices[0].message.content },
}));
