// Drives Branchpoint's Conversations API with the official openai Node package: a conversation
// with items and metadata, a response continuing it (conversation=), its items listed, one
// deleted (a branch), a call with context_management and truncation, and compact. Prints what it
// saw as one JSON object (tests/test_conversations_node.py checks it).
import OpenAI from "openai";

const { BASE_URL, API_KEY } = process.env;
const client = new OpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: API_KEY, maxRetries: 0 });
const item = (text) => ({ type: "message", role: "user", content: text });

const conv = await client.conversations.create({ items: [item("node item one"), item("node item two")],
                                                 metadata: { sdk: "node" } });
const answer = await client.responses.create({ model: "gpt-4o-mini", conversation: conv.id, input: "node question" });
const listed = [];
for await (const i of client.conversations.items.list(conv.id, { order: "asc", limit: 2 })) listed.push(i);
await client.conversations.items.delete(listed[1].id, { conversation_id: conv.id });
const after = (await client.conversations.items.list(conv.id, { order: "asc" })).data;
const facts = Array.from({ length: 10 }, (_, i) => item(`node fact ${i}`));
const long = await client.conversations.create({ items: facts });
const compacted = await client.responses.create({
  model: "gpt-4o-mini", conversation: long.id, input: "after the facts", truncation: "disabled",
  context_management: [{ type: "compaction", compact_threshold: 60 }],
});
const now = await client.responses.compact({ model: "gpt-4o-mini", input: facts });
const text = (i) => (typeof i.content === "string" ? i.content : i.content.map((p) => p.text).join(""));

console.log(JSON.stringify({
  conversation: { id: conv.id, metadata: (await client.conversations.retrieve(conv.id)).metadata },
  answer: answer.output_text,
  listed: listed.map(text), ids: listed.map((i) => i.id),
  after: after.map(text), afterIds: after.map((i) => i.id),
  compacted: { types: compacted.output.map((i) => i.type), text: compacted.output_text,
               summary: compacted.output[0].summary?.[0]?.text },
  now: { object: now.object, types: now.output.map((i) => i.type) },
}));
