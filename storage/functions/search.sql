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
--   * attachments: a string that is one data: URL, or one unbroken run of base64 characters
--     holding at least three '+' or '/' (an image, a PDF, an audio answer as Anthropic's and
--     OpenAI's APIs carry them: random base64 of 200 characters holds six on average) -- no words
--     anyone searches for, and random base64 splits into about as many distinct lexemes as it has
--     bytes. (Not "200 or more such characters": a bounded repetition that long builds a large
--     automaton at every match, ~4 us a string, ~10 % of the database's CPU for a stored call;
--     this one, a handful of states, costs next to nothing. Hex hashes and other tokens stay, up
--     to the bound below.);
--   * the middle of a huge node: of what was sent (the node's items in order, as JSON text) the
--     first 49,152 and the last 16,384 characters when it holds more than 65,536, of what was
--     received the first and the last 16,384 when it holds more than 32,768 -- so the question
--     after a long tool result, or the answer after a long thinking block, is still found.
--     PostgreSQL refuses a vector of 1 MB of lexemes (54000), and that refusal failed the whole
--     INSERT or UPDATE of the node: a text of unique tokens (hashes, a lockfile) past ~700 KB
--     could not be stored at all. The simple parser yields at most ~8 bytes of vector per
--     character (a hyphenated word of 4-byte letters: the word and each part, each with its
--     position), so the 98,306 characters kept stay under the limit whatever they hold.
-- The strings kept are one JSON array each side, read as text: its quotes and commas parse as
-- blanks, and every escape (\n, \t, \", \\ -- a Windows path's or LaTeX's backslash) is made a
-- blank whole, so the word after it is read from its first letter.
-- PL/pgSQL, whose plans are kept for the session: a SQL function with more than one statement's
-- worth of body (its text used more than once) is planned again at every write of a node.
CREATE OR REPLACE FUNCTION bp_search_vector(p_sent jsonb, p_received jsonb)
RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_sent text := jsonb_path_query_array(p_sent,
        'strict $.** ? (@.type() == "string" && !(@ like_regex "^(data:[^,\\s]*,\\S*|[A-Za-z0-9=]*[+/][A-Za-z0-9+/=]*[+/][A-Za-z0-9+/=]*[+/][A-Za-z0-9+/=]*)$"))')::text;
    v_received text := jsonb_path_query_array(coalesce(p_received, '[]'::jsonb),
        'strict $.** ? (@.type() == "string" && !(@ like_regex "^(data:[^,\\s]*,\\S*|[A-Za-z0-9=]*[+/][A-Za-z0-9+/=]*[+/][A-Za-z0-9+/=]*[+/][A-Za-z0-9+/=]*)$"))')::text;
BEGIN
    IF length(v_sent) > 65536 THEN
        v_sent := left(v_sent, 49152) || ' ' || right(v_sent, 16384);
    END IF;
    IF length(v_received) > 32768 THEN
        v_received := left(v_received, 16384) || ' ' || right(v_received, 16384);
    END IF;
    RETURN to_tsvector('simple'::regconfig, regexp_replace(v_sent || ' ' || v_received, '\\.', ' ', 'g'));
END
$$;
