-- 0005: a node's outcome is one explicit column; its status is derived from it.
--
-- Why: which row of the failure table applied to a call (success, transient, overflow, invalid)
-- decides whether the head may rest on its node. It used to live inside `error->>'kind'`, written
-- by some paths and not by others (the reaper), so every reader re-derived it with a default.
-- Now every path writes `outcome`, one function (bp_can_be_head, functions.sql) reads it, and
-- `status` (pending | success | failed, the name the admin API shows) is computed from it, so
-- the two can never disagree.

ALTER TABLE nodes ADD COLUMN outcome text
    CHECK (outcome IN ('success', 'transient', 'overflow', 'invalid'));

UPDATE nodes SET outcome = CASE
        WHEN status = 'success' THEN 'success'
        WHEN status = 'failed' THEN coalesce(error ->> 'kind', 'transient')
    END,
    error = CASE WHEN error ? 'kind' THEN error - 'kind' ELSE error END;

DROP INDEX nodes_pending_lease;
ALTER TABLE nodes DROP COLUMN status;  -- its CHECK constraints go with it
ALTER TABLE nodes ADD COLUMN status text GENERATED ALWAYS AS (
    CASE WHEN outcome IS NULL THEN 'pending' WHEN outcome = 'success' THEN 'success' ELSE 'failed' END
) STORED;
ALTER TABLE nodes ADD CONSTRAINT nodes_pending_has_lease CHECK ((outcome IS NULL) = (lease_until IS NOT NULL));

-- the reaper: pending nodes whose lease ran out
CREATE INDEX nodes_pending_lease ON nodes (lease_until) WHERE outcome IS NULL;

-- bp_path returns SETOF nodes, whose row type just changed
DROP FUNCTION IF EXISTS bp_path(uuid, uuid);
DROP FUNCTION IF EXISTS bp_begin_call(text, text, uuid, uuid, text, text, uuid, jsonb, bytea, double precision, text, text, jsonb);
DROP FUNCTION IF EXISTS bp_finish_call(uuid, uuid, text, jsonb, jsonb, text, jsonb, bytea, boolean);
DROP FUNCTION IF EXISTS bp_lock_for_head_move(text, text);
DROP FUNCTION IF EXISTS bp_switch(text, text, uuid);
DROP FUNCTION IF EXISTS bp_fork(text, text, text, uuid, boolean);
DROP FUNCTION IF EXISTS bp_set_head(text, text, uuid);
DROP FUNCTION IF EXISTS bp_delete_conversation(text, text);
DROP FUNCTION IF EXISTS bp_apply_compaction(text, text, uuid, uuid, uuid, jsonb, bytea, text, text, jsonb, jsonb, text, uuid, bytea);

-- what assembly reads of a path node (bp_begin_call returns the parent's path as these)
CREATE TYPE bp_path_node AS (
    id uuid, parent_id uuid, kind text, status text, sent jsonb, received jsonb,
    provider text, model text, usage jsonb, compacted_from uuid
);
