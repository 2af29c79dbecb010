-- 0009: nodes made by Responses API calls.
--
-- Why: a conversation may mix chat completions and the Responses API. A node keeps what its call
-- sent and received in that call's own format (messages, or Responses items), and `api` says
-- which, so assembly can read any node as messages and send items back natively to a Responses
-- upstream. `response_deleted`: DELETE /v1/responses/{id} on a node other nodes still need as
-- context hides the response without cutting the tree (docs/behaviour.md#the-responses-api).

ALTER TABLE nodes ADD COLUMN api text NOT NULL DEFAULT 'chat' CHECK (api IN ('chat', 'responses'));
ALTER TABLE nodes ADD COLUMN response_deleted boolean NOT NULL DEFAULT false;
ALTER TYPE bp_path_node ADD ATTRIBUTE api text;

DROP FUNCTION IF EXISTS bp_tail(jsonb, integer, boolean);
DROP FUNCTION IF EXISTS bp_begin_call(text, text, text, uuid, uuid, text, text, text, uuid, jsonb, bytea[], bytea[], integer, bytea, double precision, text, text, jsonb);
DROP FUNCTION IF EXISTS bp_begin_full(text, text, text, uuid, uuid, text, jsonb, bytea[], integer, bytea, double precision, text, text, jsonb);
