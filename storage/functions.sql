-- Server-side functions, re-applied (CREATE OR REPLACE) by every migration run after the numbered
-- migrations. Why functions: the start of a call needs a handful of dependent decisions (lease,
-- parent, retry recognition, insert, path read) that must happen atomically; one function call is
-- one round trip and one transaction, and reads top to bottom like the rules in SPEC §2-§4.

-- bp_path(tree, node): the path from `node` up to the first node without a parent, root first.
-- $1 tree_id, $2 node id.  One recursive CTE (SPEC §3).
CREATE OR REPLACE FUNCTION bp_path(p_tree uuid, p_node uuid)
RETURNS TABLE (
    id uuid, parent_id uuid, kind text, status text, sent jsonb, received jsonb,
    provider text, model text, usage jsonb, compacted_from uuid, created_at timestamptz,
    finished_at timestamptz
)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up AS (
        SELECT n.*, 0 AS lvl FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node
        UNION ALL
        SELECT n.*, up.lvl + 1 FROM nodes n
          JOIN up ON n.tree_id = p_tree AND n.id = up.parent_id
    )
    SELECT id, parent_id, kind, status, sent, received, provider, model, usage, compacted_from,
           created_at, finished_at
      FROM up ORDER BY lvl DESC
$$;

-- bp_reachable(tree, conversation, node): may `conversation` use `node` as a parent although
-- another conversation made it?  Yes when the node lies on the path of one of the conversation's
-- own nodes, of its head, or of its fork point (a fork reaches back into its source).
CREATE OR REPLACE FUNCTION bp_reachable(p_tree uuid, p_tenant text, p_conversation text, p_node uuid)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE down AS (
        SELECT n.id, n.conversation_id FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node
        UNION ALL
        SELECT n.id, n.conversation_id FROM nodes n
          JOIN down ON n.tree_id = p_tree AND n.parent_id = down.id
    )
    SELECT EXISTS (
        SELECT 1 FROM down
          LEFT JOIN conversations c ON c.tenant = p_tenant AND c.id = p_conversation
         WHERE down.conversation_id = p_conversation
            OR down.id = c.head_node_id
            OR down.id = c.fork_node_id
    )
$$;

-- bp_before_compaction(tree, head, node): does `node` lie before a compaction node on the head's
-- path (on the original path a compaction replaced), and not on the current path itself?
CREATE OR REPLACE FUNCTION bp_before_compaction(p_tree uuid, p_head uuid, p_node uuid)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE hist AS (
        SELECT n.id, n.parent_id, n.compacted_from, 0 AS phase
          FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_head
        UNION ALL
        SELECT n.id, n.parent_id, n.compacted_from,
               hist.phase + CASE WHEN hist.parent_id IS NULL THEN 1 ELSE 0 END
          FROM nodes n
          JOIN hist ON n.tree_id = p_tree AND n.id = coalesce(hist.parent_id, hist.compacted_from)
    )
    SELECT coalesce(min(phase) > 0, false) FROM hist WHERE id = p_node
$$;

-- Lock order, everywhere: the conversation row first, then node rows. Every function below that
-- touches both follows it, so two of them never wait on each other in a cycle.

-- bp_reap(tree, node): mark one pending node whose lease ran out failed with code `interrupted`
-- (its process died). A turn node that still holds its conversation's lease becomes the head, as
-- any transient failure does (SPEC §4), and the lease is released. Returns whether it reaped.
CREATE OR REPLACE FUNCTION bp_reap(p_tree uuid, p_node uuid)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    SELECT n.tenant, n.conversation_id INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM conversations c WHERE c.tenant = v.tenant AND c.id = v.conversation_id FOR UPDATE;
    UPDATE nodes n
       SET status = 'failed', lease_until = NULL, finished_at = clock_timestamp(),
           error = jsonb_build_object(
               'type', 'interrupted', 'code', 'interrupted', 'status', NULL,
               'message', 'the proxy process handling this call stopped before it finished')
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.status = 'pending' AND n.lease_until < now();
    IF NOT FOUND THEN
        -- finished, or still alive: at most a stale conversation lease remains to clear
        UPDATE conversations c SET lease_node_id = NULL, lease_until = NULL
         WHERE c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node
           AND c.lease_until < now()
           AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node
                                                    AND n.status = 'pending');
        RETURN false;
    END IF;
    UPDATE conversations c
       SET head_node_id = p_node, lease_node_id = NULL, lease_until = NULL,
           updated_at = clock_timestamp()
     WHERE c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node;
    RETURN true;
END
$$;

-- bp_renew(tree, node, seconds): a live call keeps its leases (node, and the conversation's when
-- it holds it) from running out. Returns false when the node is no longer pending.
CREATE OR REPLACE FUNCTION bp_renew(p_tree uuid, p_node uuid, p_lease_seconds double precision)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v record;
    v_until timestamptz := now() + make_interval(secs => p_lease_seconds);
BEGIN
    SELECT n.tenant, n.conversation_id INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE conversations c SET lease_until = v_until
     WHERE c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node;
    UPDATE nodes n SET lease_until = v_until
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.status = 'pending';
    RETURN FOUND;
END
$$;

-- bp_finish_call: store a call's outcome (SPEC §2 step 5). A turn call that still holds its
-- conversation's lease releases it and, when p_move_head, moves the head to its node -- the
-- caller decides that from the rule table of SPEC §4. Returns false when the node was no longer
-- pending (reaped meanwhile): nothing is written then.
--   $1 tree, $2 node, $3 status, $4 received, $5 usage, $6 finish_reason, $7 error,
--   $8 request hash, $9 move head
CREATE OR REPLACE FUNCTION bp_finish_call(
    p_tree uuid, p_node uuid, p_status text, p_received jsonb, p_usage jsonb,
    p_finish_reason text, p_error jsonb, p_request_hash bytea, p_move_head boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    SELECT n.tenant, n.conversation_id, n.kind INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v.kind = 'turn' THEN
        PERFORM 1 FROM conversations c WHERE c.tenant = v.tenant AND c.id = v.conversation_id FOR UPDATE;
    END IF;
    UPDATE nodes n
       SET status = p_status, received = p_received, usage = p_usage,
           finish_reason = p_finish_reason, error = p_error,
           request_hash = coalesce(p_request_hash, n.request_hash),
           lease_until = NULL, finished_at = clock_timestamp()
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.status = 'pending';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v.kind = 'turn' THEN
        UPDATE conversations c
           SET head_node_id = CASE WHEN p_move_head THEN p_node ELSE c.head_node_id END,
               lease_node_id = NULL, lease_until = NULL, updated_at = clock_timestamp()
         WHERE c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node;
    END IF;
    RETURN true;
END
$$;

-- bp_begin_call: start one call (SPEC §2 steps 1, 2, 4) in one round trip.
--   $1 tenant, $2 conversation id, $3 tree id for a new conversation, $4 the new node's id,
--   $5 kind ('turn' | 'transform'), $6 parent mode ('head' | 'root' | 'node'), $7 parent id
--   (mode 'node'), $8 sent items, $9 sha256 of canonical sent, $10 lease seconds, $11 model,
--   $12 provider, $13 params.
-- Returns the outcome in every row: 'ok' with the path of the chosen parent (root first; a single
-- row with null node columns when the new node is a root), or one row 'busy' (another turn call
-- holds the lease), 'parent_not_found' or 'parent_before_compaction'; nothing is written then.
CREATE OR REPLACE FUNCTION bp_begin_call(
    p_tenant text, p_conversation text, p_new_tree uuid, p_node uuid, p_kind text,
    p_parent_mode text, p_parent uuid, p_sent jsonb, p_sent_hash bytea,
    p_lease_seconds double precision, p_model text, p_provider text, p_params jsonb)
RETURNS TABLE (
    outcome text, tree_id uuid, parent_id uuid,
    id uuid, node_parent_id uuid, kind text, status text, sent jsonb, received jsonb,
    provider text, model text, usage jsonb, compacted_from uuid
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    conv conversations%ROWTYPE;
    v_parent uuid;
    v_depth integer := 0;
    v_head record;
    v_par record;
    v_lease timestamptz := now() + make_interval(secs => p_lease_seconds);
BEGIN
    -- 1. the conversation, locked for the rest of this transaction
    IF p_parent_mode = 'node' THEN
        -- a given parent needs an existing conversation: never create one just to answer 404
        IF p_kind = 'turn' THEN
            SELECT * INTO conv FROM conversations c WHERE c.tenant = p_tenant AND c.id = p_conversation FOR UPDATE;
        ELSE
            SELECT * INTO conv FROM conversations c WHERE c.tenant = p_tenant AND c.id = p_conversation;
        END IF;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'parent_not_found', NULL::uuid, NULL::uuid, NULL::uuid, NULL::uuid,
                NULL, NULL, NULL::jsonb, NULL::jsonb, NULL, NULL, NULL::jsonb, NULL::uuid;
            RETURN;
        END IF;
    ELSIF p_kind = 'turn' THEN
        INSERT INTO conversations AS c (tenant, id, tree_id) VALUES (p_tenant, p_conversation, p_new_tree)
        ON CONFLICT (tenant, id) DO UPDATE SET updated_at = c.updated_at
        RETURNING * INTO conv;
    ELSE
        -- transform calls take no lease and move no head: they never lock the conversation row,
        -- so any number of them run side by side
        INSERT INTO conversations AS c (tenant, id, tree_id) VALUES (p_tenant, p_conversation, p_new_tree)
        ON CONFLICT (tenant, id) DO NOTHING
        RETURNING * INTO conv;
        IF NOT FOUND THEN
            SELECT * INTO conv FROM conversations c WHERE c.tenant = p_tenant AND c.id = p_conversation;
        END IF;
    END IF;

    -- 2. the in-flight lease (turn calls only); a dead process's lease is reaped first
    IF p_kind = 'turn' AND conv.lease_node_id IS NOT NULL THEN
        IF conv.lease_until > now() THEN
            RETURN QUERY SELECT 'busy', conv.tree_id, NULL::uuid, NULL::uuid, NULL::uuid,
                NULL, NULL, NULL::jsonb, NULL::jsonb, NULL, NULL, NULL::jsonb, NULL::uuid;
            RETURN;
        END IF;
        PERFORM bp_reap(conv.tree_id, conv.lease_node_id);
        SELECT * INTO conv FROM conversations c WHERE c.tenant = p_tenant AND c.id = p_conversation;
        IF conv.lease_node_id IS NOT NULL THEN
            RETURN QUERY SELECT 'busy', conv.tree_id, NULL::uuid, NULL::uuid, NULL::uuid,
                NULL, NULL, NULL::jsonb, NULL::jsonb, NULL, NULL, NULL::jsonb, NULL::uuid;
            RETURN;
        END IF;
    END IF;

    -- 3. the parent
    IF p_parent_mode = 'root' THEN
        v_parent := NULL;
    ELSIF p_parent_mode = 'node' THEN
        SELECT n.id, n.depth, n.tenant, n.conversation_id INTO v_par
          FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = p_parent;
        IF NOT FOUND OR v_par.tenant <> p_tenant
           OR (v_par.conversation_id <> p_conversation
               AND NOT bp_reachable(conv.tree_id, p_tenant, p_conversation, p_parent)) THEN
            RETURN QUERY SELECT 'parent_not_found', conv.tree_id, NULL::uuid, NULL::uuid, NULL::uuid,
                NULL, NULL, NULL::jsonb, NULL::jsonb, NULL, NULL, NULL::jsonb, NULL::uuid;
            RETURN;
        END IF;
        IF conv.compactions > 0 AND conv.head_node_id IS NOT NULL
           AND bp_before_compaction(conv.tree_id, conv.head_node_id, p_parent) THEN
            RETURN QUERY SELECT 'parent_before_compaction', conv.tree_id, NULL::uuid, NULL::uuid,
                NULL::uuid, NULL, NULL, NULL::jsonb, NULL::jsonb, NULL, NULL, NULL::jsonb, NULL::uuid;
            RETURN;
        END IF;
        v_parent := v_par.id;
        v_depth := v_par.depth + 1;
    ELSE
        v_parent := conv.head_node_id;
        IF v_parent IS NOT NULL THEN
            SELECT n.parent_id, n.status, n.sent_hash, n.depth INTO v_head
              FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
            v_depth := v_head.depth + 1;
            -- SPEC §4: an SDK retry of a failed call (same items) hangs beside the failed node
            IF p_kind = 'turn' AND v_head.status = 'failed' AND v_head.sent_hash = p_sent_hash THEN
                v_parent := v_head.parent_id;
                v_depth := v_head.depth;
            END IF;
        END IF;
    END IF;

    -- 4. the pending node, and the lease it holds
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, status, sent,
                       sent_hash, model, provider, params, depth, lease_until)
    VALUES (conv.tree_id, p_node, p_tenant, p_conversation, v_parent, p_kind, 'pending', p_sent,
            p_sent_hash, p_model, p_provider, coalesce(p_params, '{}'::jsonb), v_depth, v_lease);

    IF p_kind = 'turn' THEN
        UPDATE conversations c SET lease_node_id = p_node, lease_until = v_lease, updated_at = clock_timestamp()
         WHERE c.tenant = p_tenant AND c.id = p_conversation;
    END IF;

    -- 5. the path the context is assembled from
    IF v_parent IS NULL THEN
        RETURN QUERY SELECT 'ok', conv.tree_id, NULL::uuid, NULL::uuid, NULL::uuid,
            NULL, NULL, NULL::jsonb, NULL::jsonb, NULL, NULL, NULL::jsonb, NULL::uuid;
    ELSE
        RETURN QUERY SELECT 'ok', conv.tree_id, v_parent, p.id, p.parent_id, p.kind, p.status,
            p.sent, p.received, p.provider, p.model, p.usage, p.compacted_from
          FROM bp_path(conv.tree_id, v_parent) p;
    END IF;
END
$$;
