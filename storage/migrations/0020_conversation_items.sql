-- 0020: the Conversations API (docs/behaviour.md#the-conversations-api): nodes of kind 'items',
-- and a conversation's metadata.
--
-- Why: OpenAI's Conversations API adds items to a conversation without calling a model
-- (`POST /v1/conversations`, `POST /v1/conversations/{id}/items`). Such items become one node of
-- `kind = 'items'`: its `sent` holds them (Responses items, api = 'responses'), nothing is
-- received, no upstream was called, and it succeeded -- so the head may rest on it and its items
-- are context like any sent items. A conversation's `metadata` (at most 16 string pairs, as
-- OpenAI's) is the object the Conversations API answers with; null for conversations made any
-- other way. Only an allowed value and a nullable column are added: no row is rewritten.

ALTER TABLE nodes DROP CONSTRAINT IF EXISTS nodes_kind_check;
ALTER TABLE nodes ADD CONSTRAINT nodes_kind_check CHECK (kind IN ('turn', 'transform', 'compaction', 'items'));
ALTER TABLE conversations ADD COLUMN IF NOT EXISTS metadata jsonb;
