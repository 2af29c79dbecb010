-- Server-side functions, part 5 of 6: moving the tree by request -- set the head, switch branches,
-- fork, apply a compaction, delete a conversation or a response.
--
-- Refusals: BPNFC (no such conversation), BPBSY (a turn call in flight: a head move, a delete),
-- BPNFN (a node outside the conversation's reach), BPPND (a head on a pending node), BPEXI (a
-- fork's name taken). bp_apply_compaction and bp_delete_response answer with a word instead.
-- Locks: the conversation row FOR UPDATE (a fork: its source FOR SHARE, its name through
-- bp_claim_name) before any node row; a dead process's lease is reaped first (bp_check_lease).
-- A delete then takes its tree's delete lock (bp_lock_tree_deletes) before it decides what the
-- tree's other conversations still reach, so deletes in one tree run one after the other.

-- bp_locked_conversation(tenant, conversation): the conversation's row, locked FOR UPDATE;
-- refuses with BPNFC when there is none.
CREATE OR REPLACE FUNCTION bp_locked_conversation(p_tenant text, p_conversation text)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
    v_tree uuid := bp_conversation_tree(p_tenant, p_conversation);
BEGIN
    SELECT * INTO conv FROM conversations c
     WHERE c.tree_id = v_tree AND c.tenant = p_tenant AND c.id = p_conversation
       FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM bp_refuse('BPNFC', format('conversation %L not found', p_conversation));
    END IF;
    RETURN conv;
END
$$;

-- bp_lock_for_head_move(tenant, conversation): lock a conversation for a head move (admin API).
-- Refuses with BPNFC, or BPBSY while a turn call is in flight (a dead process's lease is reaped
-- first). Returns the locked row.
CREATE OR REPLACE FUNCTION bp_lock_for_head_move(p_tenant text, p_conversation text)
RETURNS conversations
LANGUAGE plpgsql AS $$
BEGIN
    RETURN bp_check_lease(bp_locked_conversation(p_tenant, p_conversation));
END
$$;

-- bp_check_head(tree, tenant, conversation, node): refuse a node the head may not move to --
-- outside the conversation's reach (BPNFN) or still in flight (BPPND).
CREATE OR REPLACE FUNCTION bp_check_head(p_tree uuid, p_tenant text, p_conversation text, p_node uuid)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT bp_node_in_conversation(p_tree, p_tenant, p_conversation, p_node) THEN
        PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_node, p_conversation));
    END IF;
    IF EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL) THEN
        PERFORM bp_refuse('BPPND', format('node %s is still in flight', p_node));
    END IF;
END
$$;

-- bp_set_head(tenant, conversation, node): PUT /admin/conversations/{id}/head. A null node clears
-- the conversation's context (the next call starts a new root; nothing is deleted).
-- Refuses with BPNFC, BPBSY, BPNFN or BPPND.
CREATE OR REPLACE FUNCTION bp_set_head(p_tenant text, p_conversation text, p_node uuid)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    conv conversations%ROWTYPE;
BEGIN
    conv := bp_lock_for_head_move(p_tenant, p_conversation);
    IF p_node IS NOT NULL THEN
        PERFORM bp_check_head(conv.tree_id, p_tenant, p_conversation, p_node);
    END IF;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE conversations c SET head_node_id = p_node, updated_at = v_now
     WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
END
$$;

-- bp_switch(tenant, conversation, node): the branch arrows. From `node` down to a leaf, at each
-- step the newest child that can carry the head (bp_can_be_head: a turn that succeeded or failed
-- transiently, or the compaction node that replaced it), among the nodes this conversation can
-- see; the head moves there. Returns the new head. Refuses like bp_set_head.
CREATE OR REPLACE FUNCTION bp_switch(p_tenant text, p_conversation text, p_node uuid)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    conv conversations%ROWTYPE;
    v_visible uuid[] := '{}';
    v_head uuid := p_node;
    v_next uuid;
BEGIN
    conv := bp_lock_for_head_move(p_tenant, p_conversation);
    IF NOT bp_node_in_conversation(conv.tree_id, p_tenant, p_conversation, p_node) THEN
        PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_node, p_conversation));
    END IF;
    IF conv.fork_node_id IS NOT NULL THEN
        v_visible := ARRAY(SELECT bp_visible_foreign(conv.tree_id, p_tenant, p_conversation));
    END IF;
    LOOP
        SELECT n.id INTO v_next FROM nodes n
         WHERE n.tree_id = conv.tree_id
           AND ((n.parent_id = v_head AND n.kind IN ('turn', 'items'))
                OR (n.kind = 'compaction' AND n.compacted_from = v_head))
           AND bp_can_be_head(n.kind, n.outcome)
           AND (n.conversation_id = p_conversation OR n.id = ANY(v_visible))
         ORDER BY n.created_at DESC, n.id DESC
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        v_head := v_next;
    END LOOP;
    PERFORM bp_check_head(conv.tree_id, p_tenant, p_conversation, v_head);
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE conversations c SET head_node_id = v_head, updated_at = v_now
     WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
    RETURN v_head;
END
$$;

-- bp_fork(tenant, source, new id, node, use head): POST /admin/conversations/{id}/fork. A new
-- conversation of the same tree whose head is `node` (the source's head when p_use_head).
-- Nothing is copied. The source row is share-locked, so a fork and a delete of its source
-- serialise: the fork either sees the source (and the delete then keeps what the fork reaches)
-- or finds it gone. Returns the new head. Refuses with BPNFC, BPNFN, BPPND or BPEXI.
CREATE OR REPLACE FUNCTION bp_fork(p_tenant text, p_source text, p_new text, p_node uuid, p_use_head boolean)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    src conversations%ROWTYPE;
    v_node uuid := p_node;
    v_tree uuid := bp_conversation_tree(p_tenant, p_source);
    v_alias uuid := bp_tree_of(p_tenant, p_new);
BEGIN
    SELECT * INTO src FROM conversations c
     WHERE c.tree_id = v_tree AND c.tenant = p_tenant AND c.id = p_source FOR SHARE;
    IF NOT FOUND THEN
        PERFORM bp_refuse('BPNFC', format('conversation %L not found', p_source));
    END IF;
    IF p_use_head THEN
        v_node := src.head_node_id;
    ELSIF v_node IS NULL OR NOT bp_node_in_conversation(src.tree_id, p_tenant, p_source, v_node) THEN
        PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_node, p_source));
    ELSIF EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = src.tree_id AND n.id = v_node AND n.outcome IS NULL) THEN
        -- a head never rests on a call in flight (bp_check_head): a fork's first one neither
        PERFORM bp_refuse('BPPND', format('node %s is still in flight', p_node));
    END IF;
    -- the fork lives in its source's tree; its name points there from its own derived tree
    IF bp_claim_name(p_tenant, p_new, src.tree_id) IS NULL THEN
        PERFORM bp_refuse('BPEXI', format('conversation %L already exists', p_new));
    END IF;
    INSERT INTO conversation_aliases (tree_id, tenant, id, target)
    VALUES (v_alias, p_tenant, p_new, src.tree_id)
    ON CONFLICT (tree_id, tenant, id) DO NOTHING;
    INSERT INTO conversations (tenant, id, tree_id, head_node_id, forked_from, fork_node_id, compactions)
    VALUES (p_tenant, p_new, src.tree_id, v_node, p_source, v_node, src.compactions);
    RETURN v_node;
END
$$;

-- bp_fork_into_empty(tenant, source, target, node): bp_fork into a conversation that exists but
-- has no node yet (made by the Conversations API without items, say): a session continuing
-- another one names it (docs/behaviour.md#full-history-mode). Its row is made again as the fork,
-- in its source's tree, with its metadata and its creation time; refused BPEXI when it holds a
-- node, a head or a fork already (then it starts as any named conversation does).
CREATE OR REPLACE FUNCTION bp_fork_into_empty(p_tenant text, p_source text, p_target text, p_node uuid)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_tree uuid := bp_conversation_tree(p_tenant, p_target);
    target conversations%ROWTYPE;
    v_node uuid;
BEGIN
    target := bp_lock_conversation(v_tree, p_tenant, p_target, true);
    IF target.id IS NULL THEN
        PERFORM bp_refuse('BPNFC', format('conversation %L not found', p_target));
    END IF;
    IF target.head_node_id IS NOT NULL OR target.forked_from IS NOT NULL OR target.lease_node_id IS NOT NULL
       OR EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = v_tree AND n.tenant = p_tenant
                                          AND n.conversation_id = p_target) THEN
        PERFORM bp_refuse('BPEXI', format('conversation %L already holds nodes', p_target));
    END IF;
    DELETE FROM conversations c WHERE c.tree_id = v_tree AND c.tenant = p_tenant AND c.id = p_target;
    DELETE FROM conversation_aliases a
     WHERE a.tree_id = bp_tree_of(p_tenant, p_target) AND a.tenant = p_tenant AND a.id = p_target;
    v_node := bp_fork(p_tenant, p_source, p_target, p_node, false);
    UPDATE conversations c SET metadata = target.metadata, created_at = target.created_at
     WHERE c.tree_id = bp_conversation_tree(p_tenant, p_target) AND c.tenant = p_tenant AND c.id = p_target;
    RETURN v_node;
END
$$;

-- bp_apply_compaction: write a compaction node and point the conversation at it, in one
-- transaction -- or write nothing. Modes:
--   'turn'       the call's own synchronous compaction: it must still hold the lease; its pending
--                node moves under the compaction node, and the head moves to it when it was the
--                head's path that was compacted (an edit's compacted parent path is no move of the
--                head: the call's outcome moves it, by the head rule -- a refused edit leaves it);
--   'transform'  a side call's: its node moves under the compaction node, and the head never moves
--                (a side call's head rule -- and the summary was shaped by its items, not the
--                conversation's: what it kept raw made room for them);
--   'full'       the same for a full-history call (no lease): the head moves only if it still is
--                the node compacted from and no turn is in flight;
--   'background', 'admin'  applied only if the head still is the node compacted from and no turn
--                call is in flight; else nothing is written ('moved' / 'busy').
--   p_tenant, p_conversation, p_tree; p_node (the compaction node's id), p_compacted_from;
--   p_sent (summary + kept items), p_system_hash (of the system messages among them); p_model, p_provider, p_params, p_usage (of the
--   summariser); p_mode; p_call_node (turn/transform: the call's pending node); p_request (the
--   summariser's first request body, kept for GET /admin/nodes/{id}/request).
-- Returns 'ok', 'moved', 'busy', 'lost_lease' or 'conversation_not_found'.
CREATE OR REPLACE FUNCTION bp_apply_compaction(
    p_tenant text, p_conversation text, p_tree uuid, p_node uuid, p_compacted_from uuid,
    p_sent jsonb, p_system_hash bytea, p_model text, p_provider text, p_params jsonb, p_usage jsonb,
    p_mode text, p_call_node uuid, p_request bytea)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    conv conversations%ROWTYPE;
    v_free boolean;
    v_move boolean;
    v_from record;
BEGIN
    SELECT * INTO conv FROM conversations c
     WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'conversation_not_found';
    END IF;
    v_free := conv.lease_node_id IS NULL OR conv.lease_until < now();
    IF p_mode = 'turn' THEN
        IF conv.lease_node_id IS DISTINCT FROM p_call_node THEN
            RETURN 'lost_lease';
        END IF;
        v_move := conv.head_node_id IS NOT DISTINCT FROM p_compacted_from;
    ELSIF p_mode = 'transform' THEN
        v_move := false;
    ELSIF p_mode = 'full' THEN
        v_move := conv.head_node_id IS NOT DISTINCT FROM p_compacted_from AND v_free;
    ELSE
        IF conv.head_node_id IS DISTINCT FROM p_compacted_from THEN
            RETURN 'moved';
        END IF;
        IF NOT v_free THEN
            RETURN 'busy';
        END IF;
        v_move := true;
    END IF;

    -- a compaction node stands for the conversation it replaced: it has that node's transcript
    SELECT n.chain, n.answered INTO v_from FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_compacted_from;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    -- (made and finished at one moment: the column's own default would read the clock again, later)
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent,
                       model, provider, params, usage, compacted_from, depth, created_at, finished_at,
                       summariser_request, request_hash, chain, answered, system_hash)
    VALUES (p_tree, p_node, p_tenant, p_conversation, NULL, 'compaction', 'success', p_sent,
            p_model, p_provider, coalesce(p_params, '{}'::jsonb), p_usage, p_compacted_from, 0, v_now, v_now,
            p_request, sha256(p_request), v_from.chain, coalesce(v_from.answered, false), p_system_hash);
    IF p_call_node IS NOT NULL THEN
        UPDATE nodes n SET parent_id = p_node, depth = 1
         WHERE n.tree_id = p_tree AND n.id = p_call_node AND n.outcome IS NULL;
    END IF;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    UPDATE conversations c
       SET compactions = c.compactions + 1,
           head_node_id = CASE WHEN v_move THEN p_node ELSE c.head_node_id END,
           updated_at = v_now
     WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation;
    RETURN 'ok';
END
$$;

-- bp_record_attempt(tree, node, parent, attempt, error, request_hash): an attempt of a call that is
-- tried again under the same pending node (a Responses call with truncation "auto" that the
-- upstream refused as too long: compacted, then sent again) kept as a node of its own -- a failed
-- child of the parent the attempt hung under, with the call's items, its request and its error
-- (an overflow: the head does not move) -- so every attempt sent upstream is one node. Returns
-- false when the node is no longer pending (nothing is written).
--   p_tree, p_node   the call's pending node; p_parent   where the attempt hung (null: a root)
--   p_attempt        the attempt's new id; p_error   its error ({type, code, message, status})
--   p_request_hash   the sha256 of what it sent
CREATE OR REPLACE FUNCTION bp_record_attempt(p_tree uuid, p_node uuid, p_parent uuid, p_attempt uuid, p_error jsonb,
                                             p_request_hash bytea)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    v_depth integer;
BEGIN
    SELECT n.depth + 1 INTO v_depth FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_parent;
    v_now := clock_timestamp();  -- (not inside the statement: Citus refuses volatile calls there)
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, model, provider, params,
                       depth, chain, answered, system_hash, api, outcome, error, request_hash,
                       created_at, finished_at)
    SELECT n.tree_id, p_attempt, n.tenant, n.conversation_id, p_parent, n.kind, n.sent, n.model, n.provider,
           n.params, coalesce(v_depth, 0), n.chain, n.answered, n.system_hash, n.api, 'overflow', p_error,
           p_request_hash, n.created_at, v_now
      FROM nodes n
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL;
    RETURN FOUND;
END
$$;

-- bp_lock_tree_deletes(tree, wait): the tree's delete lock, a transaction advisory lock (in a
-- key space of its own: the two-integer form, never bp_claim_name's). Every delete takes it after
-- its conversation's row and before it reads what the tree's other conversations reach: two
-- deletes in one tree (a conversation and its fork, at once) otherwise each saw the other's
-- conversation still there, kept what it reached, and both went -- leaving nodes nothing
-- reaches. Waits when `wait`, else returns whether it got the lock (retention skips the tree).
-- Nothing that holds it waits on a conversation row, so a delete waiting for it deadlocks nobody.
CREATE OR REPLACE FUNCTION bp_lock_tree_deletes(p_tree uuid, p_wait boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_wait THEN
        PERFORM pg_advisory_xact_lock(1651532916, hashtext(p_tree::text));  -- 1651532916: 'bpdt'
        RETURN true;
    END IF;
    RETURN pg_try_advisory_xact_lock(1651532916, hashtext(p_tree::text));
END
$$;

-- bp_delete_conversation(tenant, conversation): DELETE /admin/conversations/{id}. Deletes the
-- conversation and its nodes -- except those another conversation of the tree (a fork) still
-- reaches, which stay so that the fork's context never breaks (withdrawn from the Responses API:
-- GET /v1/responses/{id} and previous_response_id no longer find them -- and relabelled: no
-- conversation's own any more); they go once nothing reaches them. Refused (BPBSY) while a call
-- of the conversation is in flight; BPNFC when it is unknown.
-- Deletes in one tree are serialised (bp_lock_tree_deletes): each statement after the lock sees
-- what an earlier delete committed (read committed), so the last of them takes what nothing
-- reaches any more. Returns (deleted nodes, kept nodes).
CREATE OR REPLACE FUNCTION bp_delete_conversation(p_tenant text, p_conversation text,
                                                  OUT deleted integer, OUT kept integer)
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
DECLARE
    conv conversations%ROWTYPE;
    v_alias uuid := bp_tree_of(p_tenant, p_conversation);
BEGIN
    deleted := 0;
    kept := 0;
    conv := bp_locked_conversation(p_tenant, p_conversation);
    IF (conv.lease_node_id IS NOT NULL AND conv.lease_until > now())
       OR EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = conv.tree_id AND n.tenant = p_tenant
                                          AND n.conversation_id = p_conversation
                                          AND n.outcome IS NULL AND n.lease_until > now()) THEN
        PERFORM bp_refuse('BPBSY', format('conversation %L has a call in flight; retry when it has finished', p_conversation));
    END IF;
    PERFORM bp_lock_tree_deletes(conv.tree_id);
    DELETE FROM conversations c WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
    DELETE FROM conversation_aliases a
     WHERE a.tree_id = v_alias AND a.tenant = p_tenant AND a.id = p_conversation;

    IF NOT EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = conv.tree_id) THEN
        DELETE FROM nodes n WHERE n.tree_id = conv.tree_id;  -- the tree has no other conversation
        GET DIAGNOSTICS deleted = ROW_COUNT;
        RETURN;
    END IF;

    WITH RECURSIVE seeds AS (
        SELECT n.id FROM nodes n
          JOIN conversations c ON c.tree_id = n.tree_id AND c.tenant = n.tenant AND c.id = n.conversation_id
         WHERE n.tree_id = conv.tree_id
        UNION
        SELECT x.id FROM conversations c, LATERAL (VALUES (c.head_node_id), (c.fork_node_id)) x(id)
         WHERE c.tree_id = conv.tree_id AND x.id IS NOT NULL
    ), live AS (
        SELECT n.id, n.parent_id, n.compacted_from FROM seeds JOIN nodes n ON n.tree_id = conv.tree_id AND n.id = seeds.id
        UNION
        SELECT step.id, step.parent_id, step.compacted_from FROM live
         CROSS JOIN LATERAL (
             SELECT n.id, n.parent_id, n.compacted_from FROM nodes n
              WHERE n.tree_id = conv.tree_id AND n.id IN (live.parent_id, live.compacted_from) LIMIT 2) step
    ), gone AS (
        DELETE FROM nodes n
         WHERE n.tree_id = conv.tree_id
           AND NOT EXISTS (SELECT 1 FROM live WHERE live.id = n.id)
           AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = n.tree_id AND c.tenant = n.tenant
                                                           AND c.id = n.conversation_id)
        RETURNING 1
    )
    SELECT count(*) INTO deleted FROM gone;
    -- what stays is the fork's context, no longer this conversation's responses: withdrawn, as
    -- bp_delete_response withdraws one other nodes need -- and no longer this name's nodes either:
    -- they are relabelled '<id> (deleted)', which no conversation id can be (a space), so a new
    -- conversation of this name made in this tree (a fork of a fork, a session continuing one)
    -- never takes them for its own: its counts, its reach, its search hits, what its delete keeps
    UPDATE nodes n SET response_deleted = true, conversation_id = p_conversation || ' (deleted)'
     WHERE n.tree_id = conv.tree_id AND n.tenant = p_tenant AND n.conversation_id = p_conversation;
    GET DIAGNOSTICS kept = ROW_COUNT;
END
$$;

-- bp_delete_response(tenant, node): DELETE /v1/responses/{id}. A response no other node needs is
-- deleted with its node: no children, nothing compacted from it, no conversation's head, fork
-- point or lease on it. Otherwise the node stays -- it is part of other calls' context -- and only
-- the response is withdrawn: GET /v1/responses/{id} and previous_response_id no longer find it.
-- Returns 'deleted', 'withdrawn' or 'not_found'.
CREATE OR REPLACE FUNCTION bp_delete_response(p_tenant text, p_node uuid)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    SELECT n.tree_id, n.conversation_id, n.outcome INTO v FROM nodes n
     WHERE n.id = p_node AND n.tenant = p_tenant AND NOT n.response_deleted;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    PERFORM 1 FROM conversations c WHERE c.tree_id = v.tree_id AND c.tenant = p_tenant AND c.id = v.conversation_id
       FOR UPDATE;
    IF v.outcome IS NULL
       OR EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = v.tree_id AND n.parent_id = p_node)
       OR EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = v.tree_id AND n.compacted_from = p_node)
       OR EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = v.tree_id
                     AND p_node IN (c.head_node_id, c.fork_node_id, c.lease_node_id)) THEN
        UPDATE nodes n SET response_deleted = true WHERE n.tree_id = v.tree_id AND n.id = p_node;
        RETURN 'withdrawn';
    END IF;
    BEGIN
        DELETE FROM nodes n WHERE n.tree_id = v.tree_id AND n.id = p_node;
    EXCEPTION WHEN foreign_key_violation THEN  -- a call hung under it meanwhile: it is context now
        UPDATE nodes n SET response_deleted = true WHERE n.tree_id = v.tree_id AND n.id = p_node;
        RETURN 'withdrawn';
    END;
    RETURN 'deleted';
END
$$;
