-- 0004: keep the summariser's request of a compaction node.
--
-- Why: GET /admin/nodes/{id}/request answers "what did the model see?". For turn and transform
-- nodes the request is rebuilt from the tree and checked against request_hash; a compaction
-- node's request (the summariser prompt over the older part of a path, possibly in chunks) is
-- not derivable from the tree alone, so its first summariser request body is kept with it.
-- Only compaction nodes (a few per long conversation) fill it; TOAST compresses it.
ALTER TABLE nodes ADD COLUMN summariser_request bytea;
DROP FUNCTION IF EXISTS bp_apply_compaction(text, text, uuid, uuid, uuid, jsonb, bytea, text, text, jsonb, jsonb, text, uuid);
