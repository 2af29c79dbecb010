-- Server-side functions, part 8 of 8: what full-text search reads of a node
-- (GET /admin/conversations?q=, docs/behaviour.md#admin-api).
--
-- Refusals: none. Locks: none (a pure function of its arguments).
--
-- The text-search index of nodes is over bp_search_vector (migration 0027, which makes this
-- function before the index; storage/queries/admin.py's SEARCH repeats the expression so the index
-- is used). An index keeps the vectors its rows had when they were written: a change to what this
-- function returns must come with a migration that rebuilds nodes_text_search, or the nodes
-- stored before it stay indexed the old way.

-- bp_search_vector(sent, received): the words of a node's items for the full-text index -- every
-- string of them (texts, tool arguments and results, whatever the API; no keys), with the
-- 'simple' configuration (no stemming, no stop words: code, ids and any language match as
-- written), but for
--   * attachments: a string that is one data: URL, or one unbroken run of 200 or more base64 /
--     hex characters (an image, a PDF, an audio answer, a token) -- no words anyone searches for,
--     and random base64 splits into about as many distinct lexemes as it has bytes;
--   * what is past a bound: the first 65,536 characters of what was sent (the node's items in
--     order) and the first 32,768 of what was received. PostgreSQL refuses a vector of 1 MB of
--     lexemes (54000), and that refusal failed the whole INSERT or UPDATE of the node: a text of
--     unique tokens (hashes, a lockfile) past ~700 KB could not be stored at all. The simple parser
--     yields at most ~8 bytes of vector per character (a hyphenated word of 4-byte letters: the
--     word and each part, each with its position), so 98,305 characters stay under the limit
--     whatever they hold.
-- One expression of built-ins, so PostgreSQL inlines it into the index and the search query (a
-- function body it must plan, or a loop over the items, cost ~0.7 ms a call: it runs for every node
-- written): the strings kept are one JSON array each side, read as text -- its quotes and commas
-- parse as blanks, its escaped line breaks and tabs are made blanks first.
CREATE OR REPLACE FUNCTION bp_search_vector(p_sent jsonb, p_received jsonb)
RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_tsvector('simple'::regconfig,
        left(replace(replace(replace(jsonb_path_query_array(p_sent, 'strict $.** ? (@.type() == "string" && !(@ like_regex "^(data:[^,\\s]*,\\S*|[A-Za-z0-9+/=_-]{200,})$"))')::text, '\n', ' '), '\t', ' '), '\r', ' '), 65536)
        || ' ' ||
        left(replace(replace(replace(jsonb_path_query_array(coalesce(p_received, '[]'::jsonb), 'strict $.** ? (@.type() == "string" && !(@ like_regex "^(data:[^,\\s]*,\\S*|[A-Za-z0-9+/=_-]{200,})$"))')::text, '\n', ' '), '\t', ' '), '\r', ' '), 32768))
$$;
