-- 0021: the text of every node's messages indexed for search (GET /admin/conversations?q=).
--
-- Why: finding a conversation needed its id; users remember what was said. Every string of a
-- node's sent and received items (texts, tool arguments and results, whatever the API) goes into
-- one PostgreSQL full-text index with the 'simple' configuration (no stemming, no stop words:
-- code, ids and any language match as written). An expression index: nothing is added to the
-- rows themselves; storage/queries.py's SEARCH repeats the same expression so it is used.

CREATE INDEX IF NOT EXISTS nodes_text_search ON nodes
    USING gin (jsonb_to_tsvector('simple'::regconfig, sent || coalesce(received, '[]'::jsonb), '["string"]'));
