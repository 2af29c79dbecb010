-- 0022: a conversation's counts carry its cached prompt tokens.
--
-- Why: providers bill prompt tokens their prompt cache served at a fraction of the price, and
-- context editing (docs/behaviour.md#context-editing) exists to keep that share high: a
-- conversation's usage (GET /admin/conversations/{id}) now sums them as `cached_tokens`, as the
-- usage report already did. bp_conversation_counts returns one more column; a function's result
-- type cannot be changed in place, so the old one goes and storage/functions/ creates the new one.

DROP FUNCTION IF EXISTS bp_conversation_counts(uuid, text, text);
