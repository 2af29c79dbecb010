-- 0025: a tie among full-history candidates is settled candidate by candidate.
--
-- Why: bp_match_candidates ran the head-path test (a walk from a conversation's head down to the
-- candidate) for every candidate before sorting them, though the first on its head path was all a
-- call needed. Under /auto/v1 every conversation of a tenant that began the same way is a
-- candidate, each walked from its own head: 200 conversations of 150 turns that shared an opening
-- cost ~110 ms of PostgreSQL per call continuing it, 6,000 one-turn ones ~200 ms. bp_best_candidate
-- (storage/functions/matching.sql) walks them in order and stops at the first on its head path.
-- The old function, which nothing calls any more, goes.
DROP FUNCTION IF EXISTS bp_match_candidates(text, text, uuid, uuid[], bytea, boolean, integer);
