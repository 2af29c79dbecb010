-- 0019: nodes may be stored by Anthropic's Messages API (api = 'messages').
--
-- Why: clients that speak the Messages API (Claude Code, the anthropic SDKs) are stored on the tree
-- like chat and Responses calls (docs/behaviour.md#the-messages-api); the node's `api` says how
-- its items read. Only the allowed values change: no row is rewritten.

ALTER TABLE nodes DROP CONSTRAINT IF EXISTS nodes_api_check;
ALTER TABLE nodes ADD CONSTRAINT nodes_api_check CHECK (api IN ('chat', 'responses', 'messages'));
