-- 0013: a call's start and finish each take their contract as one jsonb argument.
--
-- Why: the start's ~20 fields were spelled out five times (the lifecycle, storage/tree.py,
-- queries.BEGIN_CALL's $1..$21, bp_begin_call's and bp_begin_full's parameter lists), the finish's
-- ten four times. Now storage.tree.CallStart / CallFinish travel whole, encoded once, and the
-- functions read them in one place (storage/functions/calls.sql): adding a field is one edit in
-- Python and one in SQL. The old signatures go, so a named-argument call can never pick the wrong
-- overload; storage/functions/ creates the new ones.

DROP FUNCTION IF EXISTS bp_begin_call(text, text, text, uuid, uuid, text, text, text, uuid, jsonb, bytea[], bytea[], integer, bytea, double precision, text, text, jsonb, integer[], text, uuid[]);
DROP FUNCTION IF EXISTS bp_begin_full(text, text, text, uuid, uuid, text, jsonb, bytea[], integer, bytea, double precision, text, text, jsonb, integer[], text, uuid[]);
DROP FUNCTION IF EXISTS bp_finish_call(uuid, uuid, text, jsonb, bytea[], jsonb, text, jsonb, bytea, boolean);
