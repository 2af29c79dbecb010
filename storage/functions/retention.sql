-- Server-side functions, part 6 of 6: what ends calls and conversations nobody finishes -- the
-- reaper (bp_reap: a dead process's pending node; bp_abandon: a start the proxy could not confirm)
-- and retention (bp_is_idle, bp_prune: docs/behaviour.md#retention); and what no conversation
-- reaches any more (bp_unreached_nodes, for `branchpoint check`).
--
-- Refusals: none raised to a caller (bp_prune skips a conversation bp_delete_conversation refuses
-- as busy). Locks: the conversation row FOR UPDATE before the node (bp_reap); bp_prune takes rows
-- FOR UPDATE SKIP LOCKED, so it never waits on a call and processes pruning at once skip each other,
-- and the tree's delete lock only when it is free (bp_lock_tree_deletes), so a pass holding the
-- locks of many trees never waits on another's (no deadlock between passes).

-- bp_reap(tree, node, abandoned): mark one pending node failed -- outcome transient, code
-- `interrupted` -- when its lease ran out (its process died), or at once when `abandoned` (the
-- process that started it lost the database's answer and will never finish it). A turn node that
-- still holds its conversation's lease becomes the head by the head rule, and the lease is
-- released. Returns whether it reaped.
CREATE OR REPLACE FUNCTION bp_reap(p_tree uuid, p_node uuid, p_abandoned boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    v record;
BEGIN
    SELECT n.tenant, n.conversation_id, n.kind INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM conversations c WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id
       FOR UPDATE;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE nodes n
       SET outcome = 'transient', lease_until = NULL, finished_at = v_now,
           error = jsonb_build_object(
               'type', 'interrupted', 'code', 'interrupted', 'status', NULL,
               'message', CASE WHEN p_abandoned
                               THEN 'the database did not confirm the start of this call in time; it was never sent upstream'
                               ELSE 'the proxy process handling this call stopped before it finished' END)
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL AND (p_abandoned OR n.lease_until < now());
    IF NOT FOUND THEN
        -- finished, or still alive: at most a stale conversation lease remains to clear
        UPDATE conversations c SET lease_node_id = NULL, lease_until = NULL
         WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node
           AND c.lease_until < now()
           AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node
                                                    AND n.outcome IS NULL);
        RETURN false;
    END IF;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE conversations c
       SET head_node_id = CASE WHEN bp_can_be_head(v.kind, 'transient') THEN p_node ELSE c.head_node_id END,
           lease_node_id = NULL, lease_until = NULL, updated_at = v_now
     WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node;
    RETURN true;
END
$$;

-- bp_abandon(node): a call whose start the proxy could not confirm (the database answered too
-- late): if its node exists and is still pending, reap it now -- the conversation is released at
-- once instead of after lease_seconds. Returns 'reaped', 'missing' (not there: the start never
-- committed, or not yet) or 'finished'.
CREATE OR REPLACE FUNCTION bp_abandon(p_node uuid)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    SELECT n.tree_id, n.outcome INTO v FROM nodes n WHERE n.id = p_node;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF v.outcome IS NOT NULL THEN
        RETURN 'finished';
    END IF;
    RETURN CASE WHEN bp_reap(v.tree_id, p_node, true) THEN 'reaped' ELSE 'finished' END;
END
$$;

-- bp_is_idle(conversation row, cutoff): retention's test (docs/behaviour.md#retention): the
-- conversation has not changed since `cutoff` -- not updated (no turn, no head move) and no node
-- of its made since (no side call either).
CREATE OR REPLACE FUNCTION bp_is_idle(p_conv conversations, p_cutoff timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT coalesce(p_conv.updated_at < p_cutoff, true) THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM nodes n
     WHERE n.conversation_id = p_conv.id AND n.tenant = p_conv.tenant
       AND n.tree_id = p_conv.tree_id AND n.created_at >= p_cutoff
     LIMIT 1;
    IF FOUND THEN
        RETURN false;
    END IF;
    RETURN p_conv.updated_at < p_cutoff;
END
$$;

-- bp_prune(cutoff, trees, tenants, ids): retention. Deletes the named conversations (found
-- by IDLE_CANDIDATES) that are idle since `cutoff` (bp_is_idle, looked at again once the row is
-- locked), as bp_delete_conversation does: what a fork still reaches stays. A conversation a call
-- holds right now (its row locked), or with a call in flight, is skipped -- a later pass takes it;
-- so is one gone meanwhile, and one whose tree another delete is at. Processes pruning at once skip
-- each other's conversations likewise.
-- Returns (conversations deleted, their nodes deleted, nodes kept for forks).
CREATE OR REPLACE FUNCTION bp_prune(p_cutoff timestamptz, p_trees uuid[], p_tenants text[], p_ids text[],
                                    OUT conversations integer, OUT deleted integer, OUT kept integer)
LANGUAGE plpgsql AS $$
DECLARE
    k record;
    conv conversations%ROWTYPE;
    r record;
BEGIN
    conversations := 0;
    deleted := 0;
    kept := 0;
    FOR k IN SELECT * FROM unnest(p_trees, p_tenants, p_ids) AS t(tree_id, tenant, id) LOOP
        SELECT * INTO conv FROM conversations cv
         WHERE cv.tree_id = k.tree_id AND cv.tenant = k.tenant AND cv.id = k.id
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND OR NOT bp_is_idle(conv, p_cutoff) THEN
            CONTINUE;
        END IF;
        IF NOT bp_lock_tree_deletes(conv.tree_id, false) THEN
            CONTINUE;  -- a delete in its tree is under way: a later pass takes it (a pass never waits)
        END IF;
        BEGIN
            SELECT * INTO r FROM bp_delete_conversation(k.tenant, k.id);
            conversations := conversations + 1;
            deleted := deleted + r.deleted;
            kept := kept + r.kept;
        EXCEPTION WHEN SQLSTATE 'BPBSY' THEN
            NULL;  -- a call in flight: it makes the conversation recent, or a later pass takes it
        END;
    END LOOP;
END
$$;

-- bp_unreached_nodes(limit): nodes no conversation of their tree reaches -- not a conversation's
-- own, nor on the way up (parents, compaction origins) from a conversation's node, head or fork
-- point. A delete takes such nodes at once, so none should exist: `branchpoint check` reports
-- them (proxy/invariants.py). Only nodes whose conversation is gone can be unreached, so the walk
-- visits those alone: the trees holding such nodes are found first (one query over all trees),
-- then each tree is walked by a query of its own (on Citus: one shard each; a recursive query
-- cannot span shards).
CREATE OR REPLACE FUNCTION bp_unreached_nodes(p_limit integer)
RETURNS TABLE (tree_id uuid, id uuid, tenant text, conversation_id text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_tree uuid;
    v_left integer := p_limit;
    r record;
BEGIN
    FOR v_tree IN SELECT DISTINCT n.tree_id FROM nodes n
                   WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = n.tree_id AND c.tenant = n.tenant
                                                                    AND c.id = n.conversation_id)
                   ORDER BY n.tree_id LOOP
        EXIT WHEN v_left IS NOT NULL AND v_left <= 0;
        FOR r IN
            WITH RECURSIVE stray AS MATERIALIZED (
                SELECT n.id, n.parent_id, n.compacted_from, n.tenant, n.conversation_id FROM nodes n
                 WHERE n.tree_id = v_tree
                   AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = n.tree_id AND c.tenant = n.tenant
                                                                  AND c.id = n.conversation_id)
            ), pointed AS (  -- what live conversations point at directly
                SELECT x.id FROM nodes k
                  JOIN conversations c ON c.tree_id = k.tree_id AND c.tenant = k.tenant AND c.id = k.conversation_id
                 CROSS JOIN LATERAL (VALUES (k.parent_id), (k.compacted_from)) x(id)
                 WHERE k.tree_id = v_tree AND c.tree_id = v_tree AND x.id IS NOT NULL
                UNION
                SELECT x.id FROM conversations c CROSS JOIN LATERAL (VALUES (c.head_node_id), (c.fork_node_id)) x(id)
                 WHERE c.tree_id = v_tree AND x.id IS NOT NULL
            ), reached AS (
                SELECT s.id, s.parent_id, s.compacted_from FROM stray s
                  JOIN pointed p ON p.id = s.id
                UNION
                SELECT s.id, s.parent_id, s.compacted_from FROM reached r
                  JOIN stray s ON s.id IN (r.parent_id, r.compacted_from)
            )
            SELECT s.id, s.tenant, s.conversation_id FROM stray s
             WHERE NOT EXISTS (SELECT 1 FROM reached r WHERE r.id = s.id)
             ORDER BY s.id
             LIMIT v_left
        LOOP
            tree_id := v_tree; id := r.id; tenant := r.tenant; conversation_id := r.conversation_id;
            RETURN NEXT;
            v_left := v_left - 1;
        END LOOP;
    END LOOP;
END
$$;
