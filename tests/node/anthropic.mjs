// Drives Branchpoint's Messages API with the official Anthropic Node package (@anthropic-ai/sdk)
// under /c/<id>: a tool round (the answer a tool_use, its tool_result sent back streamed), an edit
// via X-Parent-Node-Id, and the error a bad parent gets. MODEL picks the upstream (claude-*: an
// Anthropic one, spoken natively; any other: a chat one, translated). Prints what it saw as one JSON
// object (tests/test_node_sdk.py checks it, and what the fake upstream received).
import Anthropic from "@anthropic-ai/sdk";

const { BASE_URL, API_KEY, CONVERSATION, MODEL } = process.env;
const client = new Anthropic({ baseURL: `${BASE_URL}/c/${CONVERSATION}`, apiKey: API_KEY, maxRetries: 0 });
const tools = [{
  name: "Bash",
  description: "Runs a shell command",
  input_schema: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
}];
const headers = (response) => ({
  node: response.headers.get("x-node-id"), parent: response.headers.get("x-parent-node-id"),
  conversation: response.headers.get("x-conversation-id"),
});

const first = await client.messages
  .create({
    model: MODEL, max_tokens: 200, system: "You run commands.", tools,
    messages: [{ role: "user", content: "What is in this folder?" }],
  })
  .withResponse();
const call = first.data.content.find((b) => b.type === "tool_use");

// the tool's result goes back streamed: the SDK's event stream, read to its end
const second = await client.messages
  .create({
    model: MODEL, max_tokens: 200, tools, stream: true,
    messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "a.txt b.txt" }] }],
  })
  .withResponse();
let streamed = "";
const events = [];
let stopReason = null;
for await (const event of second.data) {
  events.push(event.type);
  if (event.type === "content_block_delta" && event.delta.type === "text_delta") streamed += event.delta.text;
  if (event.type === "message_delta") stopReason = event.delta.stop_reason;
}

// an edit of the first question: a new node beside the first, the tool round out of its context
const edit = await client.messages
  .create(
    { model: MODEL, max_tokens: 200, messages: [{ role: "user", content: "What is in the parent folder?" }] },
    { headers: { "X-Parent-Node-Id": "root" } },
  )
  .withResponse();

let error = null;
try {
  await client.messages.create(
    { model: MODEL, max_tokens: 200, messages: [{ role: "user", content: "lost" }] },
    { headers: { "X-Parent-Node-Id": "00000000-0000-7000-8000-000000000000" } },
  );
} catch (err) {
  error = { name: err.constructor.name, status: err.status, type: err.error?.error?.type, body: err.error };
}

console.log(JSON.stringify({
  first: { ...headers(first.response), stop: first.data.stop_reason, call: { id: call.id, name: call.name, input: call.input } },
  second: { ...headers(second.response), text: streamed, events, stop: stopReason },
  edit: { ...headers(edit.response), text: edit.data.content.map((b) => b.text ?? "").join("") },
  error,
}));
