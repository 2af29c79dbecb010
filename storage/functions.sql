-- Server-side functions, re-applied (CREATE OR REPLACE) by every migration run after the numbered
-- migrations. Why functions: the start of a call needs a handful of dependent decisions (lease,
-- parent, retry recognition, insert, path read) that must happen atomically; one function call is
-- one round trip and one transaction, and reads top to bottom like the rules it implements
-- (docs/behaviour.md). Python calls them with named arguments (p_name => $n), so each parameter
-- list is documented here only.
--
-- Refusals: a rule that says no raises one of our own SQLSTATEs, and nothing is written (the
-- transaction is rolled back). storage/errors.py translates them into `Refused` exceptions:
--     BPBSY  busy                      a turn call of the conversation is in flight
--     BPNFC  conversation_not_found
--     BPNFN  node_not_found            not in this conversation's reach, or another tenant's
--     BPPBC  parent_before_compaction  an edit before a compaction of the current path
--     BPEXI  conversation_exists
--     BPPND  node_pending              a head cannot rest on a node still in flight
--
-- Where the head moves (the only places that write conversations.head_node_id):
--     bp_finish_call        a turn call ends: to its node iff bp_can_be_head(kind, outcome)
--     bp_reap               a dead process's turn call: to its node (interrupted = transient)
--     bp_apply_compaction   to the new compaction node (a background one only if nothing moved)
--     bp_set_head           PUT /admin/conversations/{id}/head
--     bp_switch             POST /admin/conversations/{id}/switch (down to a leaf that can be head)
--     bp_fork               a new conversation starts with its head on the fork node
-- bp_begin_call never moves the head; it chooses the new node's parent (the head, a given node,
-- or -- for a retry of a failed call -- the failed node's parent).
--
-- Lock order, everywhere: the conversation row first, then node rows, so two of these functions
-- never wait on each other in a cycle.
--
-- Every tree walk below is a recursive CTE whose step is one primary-key lookup, written as a
-- LATERAL subquery with LIMIT: the LIMIT keeps the planner from flattening it into a join it
-- may then run the wrong way round -- scanning the whole tree once per step, quadratic in the
-- path length (measured on a table whose statistics lagged behind its growth: 16 ms instead of
-- 0.2 ms for a 20-node path with 1,500 siblings, 140 ms instead of 3 ms for 1,000 nodes). The
-- SET clauses keep hash and merge joins, which never pay off for a walk, out as well.

-- bp_can_be_head(kind, outcome): THE head rule. A node may carry the head when it is a turn (or
-- the compaction node standing for one) that succeeded, or that failed transiently -- its sent
-- items (e.g. paid-for tool results) stay in context and a retry hangs under or beside it. An
-- overflow or an invalid request must not: every later turn would fail the same way. Transforms
-- never carry it; pending nodes (outcome null) neither.
CREATE OR REPLACE FUNCTION bp_can_be_head(p_kind text, p_outcome text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_kind IN ('turn', 'compaction') AND p_outcome IN ('success', 'transient')
$$;

-- bp_token_count(usage, key, other key): a token count of a node's reported usage -- the number
-- at `key`, else at `other key` (chat calls report prompt/completion tokens, Responses calls
-- input/output), else null. Anything but a JSON number (an upstream's odd answer) counts as none.
CREATE OR REPLACE FUNCTION bp_token_count(p_usage jsonb, p_key text, p_other text)
RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(p_usage -> p_key) = 'number' THEN (p_usage ->> p_key)::numeric
                WHEN jsonb_typeof(p_usage -> p_other) = 'number' THEN (p_usage ->> p_other)::numeric END
$$;

-- bp_token_total(sum): a sum of token counts as a bigint (0 for none; held within bigint's range
-- whatever an upstream reported).
CREATE OR REPLACE FUNCTION bp_token_total(p_sum numeric)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(least(coalesce(p_sum, 0), 9223372036854775807), -9223372036854775808)::bigint
$$;

-- bp_refuse(code, message): raise a refusal (see the table above).
CREATE OR REPLACE FUNCTION bp_refuse(p_code text, p_message text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$$;

-- bp_conversation_tree(tenant, conversation): the tree a conversation lives in -- or would be
-- made in: its derived tree bp_tree_of(tenant, id), unless an alias row there says otherwise (a
-- fork, or a name made again while its old tree is still used: docs/scaling.md). Reads only rows
-- of that derived tree.
CREATE OR REPLACE FUNCTION bp_conversation_tree(p_tenant text, p_conversation text)
RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT a.target FROM conversation_aliases a
                      WHERE a.tree_id = bp_tree_of(p_tenant, p_conversation)
                        AND a.tenant = p_tenant AND a.id = p_conversation),
                    bp_tree_of(p_tenant, p_conversation))
$$;

-- bp_claim_name(tenant, conversation, spare): make room for a new conversation of this name and
-- return the tree it is made in: its derived tree, or -- when that tree still holds nodes (of a
-- deleted conversation of this name, kept for its forks) -- `spare`, recorded in an alias row.
-- Takes the name's lock (a transaction advisory lock on the derived tree), so two first calls,
-- or a first call and a fork, of one name never both create it. Returns null when the name is
-- taken meanwhile (re-read the conversation).
CREATE OR REPLACE FUNCTION bp_claim_name(p_tenant text, p_conversation text, p_spare uuid)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_tree uuid := bp_tree_of(p_tenant, p_conversation);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(v_tree::text, 0));
    IF EXISTS (SELECT 1 FROM conversation_aliases a WHERE a.tree_id = v_tree AND a.tenant = p_tenant
                                                     AND a.id = p_conversation)
       OR EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = v_tree AND c.tenant = p_tenant
                                                 AND c.id = p_conversation) THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = v_tree) THEN
        RETURN v_tree;
    END IF;
    INSERT INTO conversation_aliases (tree_id, tenant, id, target) VALUES (v_tree, p_tenant, p_conversation, p_spare);
    RETURN p_spare;
END
$$;

-- bp_path(tree, node): the path from `node` to its root, root first, whole rows (admin API,
-- replay). One recursive CTE carrying the rows: for the admin API's reads of whole paths it
-- measured faster than walking ids and joining back (bench/tree_reads.py).
CREATE OR REPLACE FUNCTION bp_path(p_tree uuid, p_node uuid)
RETURNS SETOF nodes
LANGUAGE sql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
    WITH RECURSIVE up (node, lvl) AS (
        SELECT first, 0 FROM nodes first WHERE first.tree_id = p_tree AND first.id = p_node
        UNION ALL
        SELECT step.parent, up.lvl + 1 FROM up
         CROSS JOIN LATERAL (SELECT parent FROM nodes parent  -- LIMIT: a fence, one PK lookup per step
                              WHERE parent.tree_id = p_tree AND parent.id = (up.node).parent_id LIMIT 1) step
    )
    SELECT (up.node).* FROM up ORDER BY up.lvl DESC
$$;

-- bp_path_nodes(tree, node, known): the path as assembly needs it (bp_path_node rows), root first,
-- ending above the first node in `known` -- nodes whose path the caller has already
-- (docs/architecture.md#the-path-cache); the first row's parent_id is then that node. No rows
-- when `node` itself is known (or null). When only `node` is missing -- the usual next turn -- its
-- row is read by its key: setting up the walk costs more than the row.
CREATE OR REPLACE FUNCTION bp_path_nodes(p_tree uuid, p_node uuid, p_known uuid[] DEFAULT '{}')
RETURNS SETOF bp_path_node
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v bp_path_node;
BEGIN
    IF p_node IS NULL OR p_node = ANY (p_known) THEN
        RETURN;
    END IF;
    SELECT n.id, n.parent_id, n.kind, n.status, n.sent, n.received, n.provider, n.model, n.usage,
           n.compacted_from, n.api INTO v
      FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v.parent_id IS NULL OR v.parent_id = ANY (p_known) THEN
        RETURN NEXT v;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM bp_path_walk(p_tree, p_node, p_known);
END
$$;

-- bp_path_walk(tree, node, known): bp_path_nodes' walk -- the walk of bp_path, stopping above the
-- first node in `known`.
CREATE OR REPLACE FUNCTION bp_path_walk(p_tree uuid, p_node uuid, p_known uuid[])
RETURNS SETOF bp_path_node
LANGUAGE sql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
    WITH RECURSIVE up (node, lvl) AS (
        SELECT first, 0 FROM nodes first
         WHERE first.tree_id = p_tree AND first.id = p_node AND first.id <> ALL (coalesce(p_known, '{}'))
        UNION ALL
        SELECT step.parent, up.lvl + 1 FROM up
         CROSS JOIN LATERAL (SELECT parent FROM nodes parent  -- LIMIT: a fence, one PK lookup per step
                              WHERE parent.tree_id = p_tree AND parent.id = (up.node).parent_id LIMIT 1) step
         WHERE (up.node).parent_id <> ALL (coalesce(p_known, '{}'))
    )
    SELECT (up.node).id, (up.node).parent_id, (up.node).kind, (up.node).status, (up.node).sent,
           (up.node).received, (up.node).provider, (up.node).model, (up.node).usage,
           (up.node).compacted_from, (up.node).api
      FROM up ORDER BY up.lvl DESC
$$;

-- bp_visible_foreign(tree, tenant, conversation): the nodes another conversation made that this
-- one can see -- everything on the paths of its own nodes, its head and its fork point (a fork
-- reaches back into its source; compaction originals included, so they can be unfolded).
-- Empty for a conversation that is not a fork: only forks share a tree.
CREATE OR REPLACE FUNCTION bp_visible_foreign(p_tree uuid, p_tenant text, p_conversation text)
RETURNS SETOF uuid
LANGUAGE sql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
    WITH RECURSIVE seeds AS (
        SELECT n.parent_id AS id FROM nodes n
         WHERE n.tree_id = p_tree AND n.tenant = p_tenant AND n.conversation_id = p_conversation
           AND n.parent_id IS NOT NULL
        UNION
        SELECT n.compacted_from FROM nodes n
         WHERE n.tree_id = p_tree AND n.tenant = p_tenant AND n.conversation_id = p_conversation
           AND n.compacted_from IS NOT NULL
        UNION
        SELECT x.id FROM conversations c, LATERAL (VALUES (c.head_node_id), (c.fork_node_id)) x(id)
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation AND c.fork_node_id IS NOT NULL
           AND x.id IS NOT NULL
    ), up AS (
        SELECT n.id, n.parent_id, n.compacted_from, n.conversation_id
          FROM seeds JOIN nodes n ON n.tree_id = p_tree AND n.id = seeds.id
        UNION
        SELECT step.id, step.parent_id, step.compacted_from, step.conversation_id
          FROM up CROSS JOIN LATERAL (
              SELECT n.id, n.parent_id, n.compacted_from, n.conversation_id FROM nodes n
               WHERE n.tree_id = p_tree AND n.id IN (up.parent_id, up.compacted_from) LIMIT 2) step
    )
    SELECT up.id FROM up, conversations c
     WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation AND c.fork_node_id IS NOT NULL
       AND up.conversation_id <> p_conversation
$$;

-- bp_node_in_conversation(tree, tenant, conversation, node): the rule for every node a request
-- names (a parent, a new head, a switch or fork start): made by this conversation, or visible
-- to it (bp_visible_foreign).
CREATE OR REPLACE FUNCTION bp_node_in_conversation(p_tree uuid, p_tenant text, p_conversation text, p_node uuid)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM nodes n
         WHERE n.tree_id = p_tree AND n.id = p_node AND n.tenant = p_tenant
           AND (n.conversation_id = p_conversation
                OR n.id IN (SELECT bp_visible_foreign(p_tree, p_tenant, p_conversation)))
    )
$$;

-- bp_before_compaction(tree, head, node): does `node` lie before a compaction node on the head's
-- path (on the original path a compaction replaced), and not on the current path itself?
CREATE OR REPLACE FUNCTION bp_before_compaction(p_tree uuid, p_head uuid, p_node uuid)
RETURNS boolean
LANGUAGE sql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
    WITH RECURSIVE hist AS (
        SELECT n.id, n.parent_id, n.compacted_from, 0 AS phase
          FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_head
        UNION ALL
        SELECT step.id, step.parent_id, step.compacted_from,
               hist.phase + CASE WHEN hist.parent_id IS NULL THEN 1 ELSE 0 END
          FROM hist CROSS JOIN LATERAL (
              SELECT n.id, n.parent_id, n.compacted_from FROM nodes n
               WHERE n.tree_id = p_tree AND n.id = coalesce(hist.parent_id, hist.compacted_from) LIMIT 1) step
    )
    SELECT coalesce(min(phase) > 0, false) FROM hist WHERE id = p_node
$$;

-- bp_reap(tree, node, abandoned): mark one pending node failed -- outcome transient, code
-- `interrupted` -- when its lease ran out (its process died), or at once when `abandoned` (the
-- process that started it lost the database's answer and will never finish it). A turn node that
-- still holds its conversation's lease becomes the head by the head rule, and the lease is
-- released. Returns whether it reaped.
CREATE OR REPLACE FUNCTION bp_reap(p_tree uuid, p_node uuid, p_abandoned boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v record;
BEGIN
    SELECT n.tenant, n.conversation_id, n.kind INTO v FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM conversations c WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id
       FOR UPDATE;
    UPDATE nodes n
       SET outcome = 'transient', lease_until = NULL, finished_at = clock_timestamp(),
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
    UPDATE conversations c
       SET head_node_id = CASE WHEN bp_can_be_head(v.kind, 'transient') THEN p_node ELSE c.head_node_id END,
           lease_node_id = NULL, lease_until = NULL, updated_at = clock_timestamp()
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
     WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id AND c.lease_node_id = p_node;
    UPDATE nodes n SET lease_until = v_until
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL;
    RETURN FOUND;
END
$$;

-- bp_finish_call: store a call's outcome. A delta turn call releases the conversation's lease if it
-- still holds it; a full-history turn call never held one. Either way the head moves to its node
-- when bp_can_be_head says so (last finisher wins). A success extends the node's transcript hash
-- by what the model returned. Returns false when the node was no longer pending (reaped
-- meanwhile): nothing is written then.
--   p_tree, p_node         the node
--   p_outcome              success | transient | overflow | invalid
--   p_received             the items the model returned (success), else null
--   p_received_digests     their digests (storage/transcript.py)
--   p_usage, p_finish_reason, p_error ({type, code, message, status}, failures)
--   p_request_hash         sha256 of the exact body sent upstream (null: none was sent)
--   p_leased               whether the call took the conversation's lease (delta turn calls)
CREATE OR REPLACE FUNCTION bp_finish_call(
    p_tree uuid, p_node uuid, p_outcome text, p_received jsonb, p_received_digests bytea[], p_usage jsonb,
    p_finish_reason text, p_error jsonb, p_request_hash bytea, p_leased boolean)
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
        PERFORM 1 FROM conversations c WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id
           FOR UPDATE;
    END IF;
    UPDATE nodes n
       SET outcome = p_outcome, received = p_received, usage = p_usage,
           finish_reason = p_finish_reason, error = p_error,
           request_hash = coalesce(p_request_hash, n.request_hash),
           chain = CASE WHEN p_outcome = 'success' THEN bp_fold(n.chain, p_received_digests) ELSE n.chain END,
           answered = n.answered OR (p_outcome = 'success' AND jsonb_array_length(coalesce(p_received, '[]')) > 0),
           lease_until = NULL, finished_at = clock_timestamp()
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.outcome IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v.kind = 'turn' THEN
        UPDATE conversations c
           SET head_node_id = CASE WHEN bp_can_be_head(v.kind, p_outcome) THEN p_node ELSE c.head_node_id END,
               lease_node_id = CASE WHEN p_leased THEN NULL ELSE c.lease_node_id END,
               lease_until = CASE WHEN p_leased THEN NULL ELSE c.lease_until END,
               updated_at = clock_timestamp()
         WHERE c.tree_id = p_tree AND c.tenant = v.tenant AND c.id = v.conversation_id
           AND (CASE WHEN p_leased THEN c.lease_node_id = p_node ELSE true END);
    END IF;
    RETURN true;
END
$$;

-- bp_check_lease(conversation row): refuse (busy) while another turn call holds the lease; a dead
-- process's lease is reaped first. Returns the conversation row as it is afterwards.
CREATE OR REPLACE FUNCTION bp_check_lease(p_conv conversations)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations := p_conv;
BEGIN
    IF conv.lease_node_id IS NOT NULL THEN
        IF conv.lease_until > now() THEN
            PERFORM bp_refuse('BPBSY', format('conversation %L has a turn call in flight; retry when it has finished', conv.id));
        END IF;
        PERFORM bp_reap(conv.tree_id, conv.lease_node_id);
        SELECT * INTO conv FROM conversations c WHERE c.tree_id = conv.tree_id AND c.tenant = conv.tenant AND c.id = conv.id;
        IF conv.lease_node_id IS NOT NULL THEN
            PERFORM bp_refuse('BPBSY', format('conversation %L has a turn call in flight; retry when it has finished', conv.id));
        END IF;
    END IF;
    RETURN conv;
END
$$;

-- bp_fold(start, digests): the transcript hash chain folded over message digests:
-- h := sha256(h || d) for each d (storage/transcript.py computes the digests).
CREATE OR REPLACE FUNCTION bp_fold(p_start bytea, p_digests bytea[])
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    h bytea := p_start;
    d bytea;
BEGIN
    FOREACH d IN ARRAY coalesce(p_digests, '{}') LOOP
        h := sha256(h || d);
    END LOOP;
    RETURN h;
END
$$;

-- bp_tail(items, skip, with_system, ordinals): the items after the first `skip` non-system
-- messages, in their order; system/developer messages kept only when `with_system`. Chat
-- messages count one each; Responses items say, in `ordinals`, which message they stand for
-- (0: a system/developer message; several items can make one message).
CREATE OR REPLACE FUNCTION bp_tail(p_items jsonb, p_skip integer, p_with_system boolean, p_ordinals integer[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_agg(e.v ORDER BY e.i), '[]'::jsonb)
      FROM (SELECT x.v, x.i, x.sys,
                   coalesce(p_ordinals[x.i], count(*) FILTER (WHERE NOT x.sys) OVER (ORDER BY x.i)) AS nth
              FROM (SELECT v, i, CASE WHEN p_ordinals IS NULL
                                      THEN coalesce(v ->> 'role' IN ('system', 'developer'), false)
                                      ELSE p_ordinals[i] = 0 END AS sys
                      FROM jsonb_array_elements(p_items) WITH ORDINALITY AS t(v, i)) x) e
     WHERE (e.sys AND p_with_system) OR (NOT e.sys AND e.nth > p_skip)
$$;

-- bp_lock_conversation(tree, tenant, conversation, for update): the conversation's row locked FOR
-- UPDATE (turn calls) or FOR KEY SHARE (side calls: they run side by side, but never beside a
-- delete of their conversation, which could otherwise remove the parent they hang under); a row
-- of nulls when there is none.
CREATE OR REPLACE FUNCTION bp_lock_conversation(p_tree uuid, p_tenant text, p_conversation text, p_for_update boolean)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
BEGIN
    IF p_for_update THEN
        SELECT * INTO conv FROM conversations c
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation FOR UPDATE;
    ELSE
        SELECT * INTO conv FROM conversations c
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation FOR KEY SHARE;
    END IF;
    RETURN conv;
END
$$;

-- bp_open_conversation(tenant, conversation, tree, spare, for update): the conversation's row,
-- locked FOR UPDATE (turn calls) or FOR KEY SHARE -- made now if this is its first call, in the
-- tree bp_claim_name gives it. `tree`: bp_conversation_tree(tenant, conversation).
CREATE OR REPLACE FUNCTION bp_open_conversation(p_tenant text, p_conversation text, p_tree uuid, p_spare uuid,
                                                p_for_update boolean)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
    v_tree uuid := p_tree;
BEGIN
    LOOP
        conv := bp_lock_conversation(v_tree, p_tenant, p_conversation, p_for_update);
        IF conv.id IS NOT NULL THEN
            RETURN conv;
        END IF;
        v_tree := bp_claim_name(p_tenant, p_conversation, p_spare);
        IF v_tree IS NOT NULL THEN
            INSERT INTO conversations (tenant, id, tree_id) VALUES (p_tenant, p_conversation, v_tree)
            RETURNING * INTO conv;
            RETURN conv;
        END IF;
        v_tree := bp_conversation_tree(p_tenant, p_conversation);  -- made meanwhile: read it there
    END LOOP;
END
$$;

-- bp_begin_call: start one call in one round trip -- the conversation (created by its first call),
-- the lease (delta turn calls only), the parent, the pending node, the parent's path.
--   p_tenant, p_conversation   who and which conversation (full mode: null = find it by content)
--   p_new_conversation         the id a conversation found by nothing gets (full mode, no id)
--   p_new_tree                 the tree id a new conversation gets
--   p_node                     the new node's id (made by the caller, so it is known even if
--                              this statement's answer is lost)
--   p_kind                     turn | transform
--   p_mode                     delta (p_sent are the new items) | full (p_sent is the whole history)
--   p_parent_mode, p_parent    delta: head | root | node (p_parent)
--   p_sent                     the call's messages
--   p_digests                  the digests of its non-system messages, in order
--   p_prefixes                 the transcript hashes of its first 1..m non-system messages (in delta
--                              mode given when it could be a resent history: the safety net below)
--   p_prefix_offset            full mode: the prefixes and p_sent's non-system messages start after
--                              this many (a window at the end of a long history: the deepest match
--                              is almost always there); 0 = complete
--   p_system_hash              the hash of its system/developer messages (null: none)
--   p_lease_seconds, p_model, p_provider, p_params (the request's other fields)
--   p_ordinals                 Responses items: the message each item of p_sent stands for (bp_tail)
--   p_api                      chat | responses: the format p_sent is in
--   p_known                    nodes whose path the caller already has (its path cache): the
--                              returned path ends above the first of them it meets
-- Returns the chosen parent's path root first as rows (conversation_id, tree_id, parent_id, mode,
-- matched, start, node) -- one row with a null node when the new node is a root, or when the
-- parent itself is known. `mode` is the
-- mode that handled the call, `matched` how many of its non-system messages matched stored nodes
-- (full mode), `start` how many of them the new node does not repeat, `with_system` whether it
-- stores the call's system messages (full mode: only when they differ from the path's). `mode` is
-- 'window' (nothing written) when a window at the end did not suffice: call again with the whole
-- history. Refuses with BPBSY, BPNFN or
-- BPPBC (delta mode).
CREATE OR REPLACE FUNCTION bp_begin_call(
    p_tenant text, p_conversation text, p_new_conversation text, p_new_tree uuid, p_node uuid,
    p_kind text, p_mode text, p_parent_mode text, p_parent uuid, p_sent jsonb, p_digests bytea[],
    p_prefixes bytea[], p_prefix_offset integer, p_system_hash bytea, p_lease_seconds double precision,
    p_model text, p_provider text, p_params jsonb, p_ordinals integer[] DEFAULT NULL, p_api text DEFAULT 'chat',
    p_known uuid[] DEFAULT '{}')
RETURNS TABLE (conversation_id text, tree_id uuid, parent_id uuid, mode text, matched integer,
               start integer, with_system boolean, node bp_path_node)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    conv conversations%ROWTYPE;
    v_parent uuid;
    v_depth integer := 0;
    v_head record;
    v_up record;
    v_lease timestamptz := now() + make_interval(secs => p_lease_seconds);
    v_ctree uuid;
BEGIN
    IF p_mode = 'full' THEN
        RETURN QUERY SELECT * FROM bp_begin_full(p_tenant, p_conversation, p_new_conversation, p_new_tree, p_node,
            p_kind, p_sent, p_prefixes, p_prefix_offset, p_system_hash, p_lease_seconds, p_model, p_provider, p_params,
            p_ordinals, p_api, p_known);
        RETURN;
    END IF;

    v_ctree := bp_conversation_tree(p_tenant, p_conversation);  -- (full mode resolves it itself)

    -- 1. the conversation, locked for the rest of this transaction (turns only: transforms take
    --    no lease and move no head, so any number of them run side by side)
    IF p_parent_mode = 'node' THEN
        -- a given parent needs an existing conversation: never create one just to answer 404
        conv := bp_lock_conversation(v_ctree, p_tenant, p_conversation, p_kind = 'turn');
        IF conv.id IS NULL THEN
            PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_parent, p_conversation));
        END IF;
    ELSE
        conv := bp_open_conversation(p_tenant, p_conversation, v_ctree, p_new_tree, p_kind = 'turn');
    END IF;

    -- 2. the safety net: a delta call whose messages begin with the parent's whole transcript,
    --    holding an answer the proxy stored, resends its history -- a delta client never resends
    --    the model's answers. It is handled in full-history mode.
    IF cardinality(p_prefixes) > 0 AND p_parent_mode <> 'root' THEN
        SELECT n.chain, n.answered INTO v_up FROM nodes n
         WHERE n.tree_id = conv.tree_id
           AND n.id = CASE WHEN p_parent_mode = 'node' THEN p_parent ELSE conv.head_node_id END;
        IF FOUND AND v_up.answered AND v_up.chain = ANY(p_prefixes) THEN
            RETURN QUERY SELECT * FROM bp_begin_full(p_tenant, p_conversation, p_new_conversation, p_new_tree,
                p_node, p_kind, p_sent, p_prefixes, 0, p_system_hash, p_lease_seconds, p_model, p_provider,
                p_params, p_ordinals, p_api, p_known);
            RETURN;
        END IF;
    END IF;

    -- 3. the in-flight lease
    IF p_kind = 'turn' THEN
        conv := bp_check_lease(conv);
    END IF;

    -- 4. the parent
    IF p_parent_mode = 'root' THEN
        v_parent := NULL;
    ELSIF p_parent_mode = 'node' THEN
        IF NOT bp_node_in_conversation(conv.tree_id, p_tenant, p_conversation, p_parent) THEN
            PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_parent, p_conversation));
        END IF;
        IF conv.compactions > 0 AND conv.head_node_id IS NOT NULL
           AND bp_before_compaction(conv.tree_id, conv.head_node_id, p_parent) THEN
            PERFORM bp_refuse('BPPBC', format(
                'node %s lies before a compaction of this conversation''s path; it can no longer be edited '
                'here (fork from it, or move the head there first)', p_parent));
        END IF;
        v_parent := p_parent;
    ELSE
        v_parent := conv.head_node_id;
        IF v_parent IS NOT NULL THEN
            SELECT n.parent_id, n.outcome, n.chain INTO v_head
              FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
            -- the retry rule: an SDK retry of a failed call (the same items) hangs beside the
            -- failed node, so the items appear once and the failed attempt stays as a branch
            IF p_kind = 'turn' AND v_head.outcome <> 'success'
               AND v_head.chain = bp_fold(coalesce((SELECT n.chain FROM nodes n WHERE n.tree_id = conv.tree_id
                                                                              AND n.id = v_head.parent_id),
                                                   '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea),
                                          p_digests) THEN
                v_parent := v_head.parent_id;
            END IF;
        END IF;
    END IF;

    -- 5. the pending node, and the lease it holds
    SELECT n.depth, n.chain, n.answered, n.system_hash INTO v_up
      FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, model, provider, params,
                       depth, lease_until, chain, answered, system_hash, api)
    VALUES (conv.tree_id, p_node, p_tenant, p_conversation, v_parent, p_kind, p_sent, p_model, p_provider,
            coalesce(p_params, '{}'::jsonb), coalesce(v_up.depth + 1, 0), v_lease,
            bp_fold(coalesce(v_up.chain, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea), p_digests),
            coalesce(v_up.answered, false), coalesce(p_system_hash, v_up.system_hash), p_api);

    IF p_kind = 'turn' THEN
        UPDATE conversations c SET lease_node_id = p_node, lease_until = v_lease, updated_at = clock_timestamp()
         WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
    END IF;

    -- 6. the path the context is assembled from (one row with a null node when there is none
    --    to read: a root, or a parent the caller has)
    RETURN QUERY SELECT conv.id, conv.tree_id, v_parent, 'delta', 0, 0, false, p
      FROM bp_path_nodes(conv.tree_id, v_parent, p_known) p;
    IF NOT FOUND THEN
        RETURN QUERY SELECT conv.id, conv.tree_id, v_parent, 'delta', 0, 0, false, NULL::bp_path_node;
    END IF;
END
$$;

-- bp_on_head_path(tree, tenant, conversation, node): does `node` lie on the head path of the
-- conversation (in `tree`)? Walks up from the head only as far as the node's depth (depth falls
-- by one per step).
CREATE OR REPLACE FUNCTION bp_on_head_path(p_tree uuid, p_tenant text, p_conversation text, p_node uuid)
RETURNS boolean
LANGUAGE sql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
    WITH RECURSIVE target AS (
        SELECT c.tree_id, c.head_node_id, n.depth
          FROM conversations c JOIN nodes n ON n.tree_id = c.tree_id AND n.id = p_node
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation
    ), up AS (
        SELECT n.id, n.parent_id, n.depth FROM target t JOIN nodes n ON n.tree_id = t.tree_id AND n.id = t.head_node_id
         WHERE n.depth >= t.depth
        UNION ALL
        SELECT step.id, step.parent_id, step.depth FROM up, target t
         CROSS JOIN LATERAL (SELECT n.id, n.parent_id, n.depth FROM nodes n
                              WHERE n.tree_id = t.tree_id AND n.id = up.parent_id LIMIT 1) step
         WHERE up.depth > t.depth
    )
    SELECT EXISTS (SELECT 1 FROM up WHERE up.id = p_node)
$$;

-- bp_begin_full: start a call in full-history mode (called by bp_begin_call). The client sent its
-- whole history; the parent is the node whose transcript equals the longest start of it:
-- candidates are the nodes whose transcript hash is one of the client's prefix hashes -- in the
-- conversation's reach, or, with no conversation named, anywhere in the tenant -- the deepest wins;
-- ties: a node on the conversation's head path, then a compaction node over the node it replaced,
-- then the newest. Nothing matched: a new root (a new conversation, p_new_conversation, when none
-- was named). Everything matched and the node failed (or is in flight): the retry rule, beside it.
-- The new node stores only what is new, and the client's system messages when they differ from
-- those in effect on the parent's path. No lease, no conversation lock: concurrent calls become
-- siblings.
CREATE OR REPLACE FUNCTION bp_begin_full(
    p_tenant text, p_conversation text, p_new_conversation text, p_new_tree uuid, p_node uuid,
    p_kind text, p_sent jsonb, p_prefixes bytea[], p_prefix_offset integer, p_system_hash bytea,
    p_lease_seconds double precision, p_model text, p_provider text, p_params jsonb,
    p_ordinals integer[] DEFAULT NULL, p_api text DEFAULT 'chat', p_known uuid[] DEFAULT '{}')
RETURNS TABLE (conversation_id text, tree_id uuid, parent_id uuid, mode text, matched integer,
               start integer, with_system boolean, node bp_path_node)
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    conv conversations%ROWTYPE;
    v_given integer := coalesce(cardinality(p_prefixes), 0);
    v_m integer := p_prefix_offset + coalesce(cardinality(p_prefixes), 0);
    v_visible uuid[] := '{}';
    v_best record;
    v_row record;
    v_up record;
    v_ties integer := 1;
    v_k integer := 0;
    i integer;
    v_start integer := 0;
    v_with_system boolean;
    v_parent uuid;
BEGIN
    IF p_conversation IS NOT NULL THEN
        -- key-share locked: calls run side by side, but never beside a delete of the conversation
        conv := bp_open_conversation(p_tenant, p_conversation, bp_conversation_tree(p_tenant, p_conversation),
                                     p_new_tree, false);
        IF conv.fork_node_id IS NOT NULL THEN
            v_visible := ARRAY(SELECT bp_visible_foreign(conv.tree_id, p_tenant, p_conversation));
        END IF;
    END IF;

    -- the deepest candidate: probe the prefixes from the longest down, one equality lookup on
    -- (tenant, chain) each -- a resent history almost always matches at its first or second
    -- probe. The tie rules are only worked out when two candidates tie (a compaction and the node
    -- it replaced, a failed attempt and its retry ...): the head-path test walks the path.
    FOR i IN REVERSE v_given..1 LOOP
        FOR v_row IN
            SELECT m.id, m.parent_id, m.tree_id, m.conversation_id, m.outcome FROM (
                -- a named conversation: its own tree only; none named: the whole tenant
                SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome, n.kind, n.created_at
                  FROM nodes n
                 WHERE p_conversation IS NOT NULL AND n.tree_id = conv.tree_id AND n.chain = p_prefixes[i]
                   AND n.kind <> 'transform' AND n.tenant = p_tenant
                   AND (n.conversation_id = p_conversation OR n.id = ANY(v_visible))
                UNION ALL
                SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome, n.kind, n.created_at
                  FROM nodes n
                 WHERE p_conversation IS NULL AND n.tenant = p_tenant AND n.chain = p_prefixes[i]
                   AND n.kind <> 'transform') m
             ORDER BY (m.kind = 'compaction') DESC, m.created_at DESC, m.id DESC
             LIMIT 2
        LOOP
            IF v_k = 0 THEN
                v_best := v_row;
                v_k := p_prefix_offset + i;
            ELSE
                v_ties := 2;
            END IF;
        END LOOP;
        EXIT WHEN v_k > 0;
    END LOOP;
    IF v_ties > 1 THEN
        SELECT m.id, m.parent_id, m.tree_id, m.conversation_id, m.outcome, v_k AS k INTO v_best FROM (
            SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome, n.kind, n.created_at
              FROM nodes n
             WHERE p_conversation IS NOT NULL AND n.tree_id = conv.tree_id
               AND n.chain = p_prefixes[v_k - p_prefix_offset] AND n.kind <> 'transform' AND n.tenant = p_tenant
               AND (n.conversation_id = p_conversation OR n.id = ANY(v_visible))
            UNION ALL
            SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome, n.kind, n.created_at
              FROM nodes n
             WHERE p_conversation IS NULL AND n.tenant = p_tenant AND n.chain = p_prefixes[v_k - p_prefix_offset]
               AND n.kind <> 'transform') m
         ORDER BY bp_on_head_path(m.tree_id, p_tenant, coalesce(p_conversation, m.conversation_id), m.id) DESC,
                  (m.kind = 'compaction') DESC, m.created_at DESC, m.id DESC
         LIMIT 1;
    END IF;
    IF v_k > 0 AND p_conversation IS NULL THEN
        SELECT * INTO conv FROM conversations c
         WHERE c.tree_id = v_best.tree_id AND c.tenant = p_tenant AND c.id = v_best.conversation_id FOR KEY SHARE;
        IF NOT FOUND THEN  -- deleted meanwhile (nodes a fork still reaches stay): start afresh
            v_k := 0;
        END IF;
    END IF;
    IF v_k > 0 THEN
        IF v_k = v_m AND v_best.outcome IS DISTINCT FROM 'success' THEN
            v_parent := v_best.parent_id;  -- the retry rule: beside the failed (or in-flight) node
        ELSE
            v_parent := v_best.id;
        END IF;
    END IF;

    IF p_prefix_offset > 0 THEN
        -- a window at the end of the history was given: enough unless nothing matched in it, or
        -- the parent's own position (the retry rule) lies before it
        IF v_k = 0 THEN
            RETURN QUERY SELECT conv.id, conv.tree_id, NULL::uuid, 'window', 0, 0, false, NULL::bp_path_node;
            RETURN;
        END IF;
        IF v_parent IS DISTINCT FROM v_best.id AND (v_parent IS NULL OR NOT EXISTS (
                SELECT 1 FROM nodes n WHERE n.tree_id = v_best.tree_id AND n.id = v_parent AND n.chain = ANY(p_prefixes))) THEN
            RETURN QUERY SELECT conv.id, conv.tree_id, NULL::uuid, 'window', 0, 0, false, NULL::bp_path_node;
            RETURN;
        END IF;
    END IF;

    IF conv.id IS NULL THEN  -- no conversation named and nothing matched: a new one
        INSERT INTO conversations (tenant, id, tree_id)
        VALUES (p_tenant, p_new_conversation, bp_claim_name(p_tenant, p_new_conversation, p_new_tree))
        RETURNING * INTO conv;
    END IF;

    SELECT n.depth, n.chain, n.answered, n.system_hash INTO v_up
      FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
    IF v_parent IS NOT NULL THEN
        v_start := p_prefix_offset + coalesce(array_position(p_prefixes, v_up.chain), 0);
    END IF;
    v_with_system := p_system_hash IS NOT NULL AND p_system_hash IS DISTINCT FROM v_up.system_hash;
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, model, provider, params,
                       depth, lease_until, chain, answered, system_hash, api)
    VALUES (conv.tree_id, p_node, p_tenant, conv.id, v_parent, p_kind,
            bp_tail(p_sent, v_start - p_prefix_offset, v_with_system, p_ordinals),
            p_model, p_provider, coalesce(p_params, '{}'::jsonb), coalesce(v_up.depth + 1, 0),
            now() + make_interval(secs => p_lease_seconds),
            CASE WHEN v_given = 0 THEN '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
                 ELSE p_prefixes[v_given] END,
            coalesce(v_up.answered, false),
            CASE WHEN v_with_system THEN p_system_hash ELSE v_up.system_hash END, p_api);

    RETURN QUERY SELECT conv.id, conv.tree_id, v_parent, 'full', v_k, v_start, v_with_system, p
      FROM bp_path_nodes(conv.tree_id, v_parent, p_known) p;
    IF NOT FOUND THEN
        RETURN QUERY SELECT conv.id, conv.tree_id, v_parent, 'full', v_k, v_start, v_with_system, NULL::bp_path_node;
    END IF;
END
$$;

-- bp_lock_for_head_move(tenant, conversation): lock a conversation for a head move (admin API).
-- Refuses with BPNFC, or BPBSY while a turn call is in flight (a dead process's lease is reaped
-- first). Returns the locked row.
CREATE OR REPLACE FUNCTION bp_lock_for_head_move(p_tenant text, p_conversation text)
RETURNS conversations
LANGUAGE plpgsql AS $$
DECLARE
    conv conversations%ROWTYPE;
BEGIN
    SELECT * INTO conv FROM conversations c
     WHERE c.tree_id = bp_conversation_tree(p_tenant, p_conversation) AND c.tenant = p_tenant AND c.id = p_conversation
       FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM bp_refuse('BPNFC', format('conversation %L not found', p_conversation));
    END IF;
    RETURN bp_check_lease(conv);
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
    conv conversations%ROWTYPE;
BEGIN
    conv := bp_lock_for_head_move(p_tenant, p_conversation);
    IF p_node IS NOT NULL THEN
        PERFORM bp_check_head(conv.tree_id, p_tenant, p_conversation, p_node);
    END IF;
    UPDATE conversations c SET head_node_id = p_node, updated_at = clock_timestamp()
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
           AND ((n.parent_id = v_head AND n.kind = 'turn')
                OR (n.kind = 'compaction' AND n.compacted_from = v_head))
           AND bp_can_be_head(n.kind, n.outcome)
           AND (n.conversation_id = p_conversation OR n.id = ANY(v_visible))
         ORDER BY n.created_at DESC, n.id DESC
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        v_head := v_next;
    END LOOP;
    PERFORM bp_check_head(conv.tree_id, p_tenant, p_conversation, v_head);
    UPDATE conversations c SET head_node_id = v_head, updated_at = clock_timestamp()
     WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
    RETURN v_head;
END
$$;

-- bp_fork(tenant, source, new id, node, use head): POST /admin/conversations/{id}/fork. A new
-- conversation of the same tree whose head is `node` (the source's head when p_use_head).
-- Nothing is copied. The source row is share-locked, so a fork and a delete of its source
-- serialise: the fork either sees the source (and the delete then keeps what the fork reaches)
-- or finds it gone. Returns the new head. Refuses with BPNFC, BPNFN or BPEXI.
CREATE OR REPLACE FUNCTION bp_fork(p_tenant text, p_source text, p_new text, p_node uuid, p_use_head boolean)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    src conversations%ROWTYPE;
    v_node uuid := p_node;
BEGIN
    SELECT * INTO src FROM conversations c
     WHERE c.tree_id = bp_conversation_tree(p_tenant, p_source) AND c.tenant = p_tenant AND c.id = p_source FOR SHARE;
    IF NOT FOUND THEN
        PERFORM bp_refuse('BPNFC', format('conversation %L not found', p_source));
    END IF;
    IF p_use_head THEN
        v_node := src.head_node_id;
    ELSIF v_node IS NULL OR NOT bp_node_in_conversation(src.tree_id, p_tenant, p_source, v_node) THEN
        PERFORM bp_refuse('BPNFN', format('node %s is not part of conversation %L', p_node, p_source));
    END IF;
    -- the fork lives in its source's tree; its name points there from its own derived tree
    IF bp_claim_name(p_tenant, p_new, src.tree_id) IS NULL THEN
        PERFORM bp_refuse('BPEXI', format('conversation %L already exists', p_new));
    END IF;
    INSERT INTO conversation_aliases (tree_id, tenant, id, target)
    VALUES (bp_tree_of(p_tenant, p_new), p_tenant, p_new, src.tree_id)
    ON CONFLICT (tree_id, tenant, id) DO NOTHING;
    INSERT INTO conversations (tenant, id, tree_id, head_node_id, forked_from, fork_node_id, compactions)
    VALUES (p_tenant, p_new, src.tree_id, v_node, p_source, v_node, src.compactions);
    RETURN v_node;
END
$$;

-- bp_delete_conversation(tenant, conversation): DELETE /admin/conversations/{id}. Deletes the
-- conversation and its nodes -- except those another conversation of the tree (a fork) still
-- reaches, which stay so that the fork's context never breaks; they go once nothing reaches
-- them. Refused (BPBSY) while a call of the conversation is in flight; BPNFC when it is unknown.
-- Returns (deleted nodes, kept nodes).
CREATE OR REPLACE FUNCTION bp_delete_conversation(p_tenant text, p_conversation text,
                                                  OUT deleted integer, OUT kept integer)
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
DECLARE
    conv conversations%ROWTYPE;
BEGIN
    deleted := 0;
    kept := 0;
    SELECT * INTO conv FROM conversations c
     WHERE c.tree_id = bp_conversation_tree(p_tenant, p_conversation) AND c.tenant = p_tenant AND c.id = p_conversation
       FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM bp_refuse('BPNFC', format('conversation %L not found', p_conversation));
    END IF;
    IF (conv.lease_node_id IS NOT NULL AND conv.lease_until > now())
       OR EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = conv.tree_id AND n.tenant = p_tenant
                                          AND n.conversation_id = p_conversation
                                          AND n.outcome IS NULL AND n.lease_until > now()) THEN
        PERFORM bp_refuse('BPBSY', format('conversation %L has a call in flight; retry when it has finished', p_conversation));
    END IF;
    DELETE FROM conversations c WHERE c.tree_id = conv.tree_id AND c.tenant = p_tenant AND c.id = p_conversation;
    DELETE FROM conversation_aliases a
     WHERE a.tree_id = bp_tree_of(p_tenant, p_conversation) AND a.tenant = p_tenant AND a.id = p_conversation;

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
    SELECT count(*) INTO kept FROM nodes n
     WHERE n.tree_id = conv.tree_id AND n.tenant = p_tenant AND n.conversation_id = p_conversation;
END
$$;

-- bp_is_idle(conversation row, cutoff): retention's test (docs/behaviour.md#retention): the
-- conversation has not changed since `cutoff` -- not updated (no turn, no head move) and no node
-- of its made since (no side call either).
CREATE OR REPLACE FUNCTION bp_is_idle(p_conv conversations, p_cutoff timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_conv.updated_at < p_cutoff
       AND NOT EXISTS (SELECT 1 FROM nodes n
                        WHERE n.conversation_id = p_conv.id AND n.tenant = p_conv.tenant
                          AND n.tree_id = p_conv.tree_id AND n.created_at >= p_cutoff)
$$;

-- bp_prune(cutoff, trees, tenants, ids): retention. Deletes the named conversations (found
-- by IDLE_CANDIDATES) that are idle since `cutoff` (bp_is_idle, looked at again once the row is
-- locked), as bp_delete_conversation does: what a fork still reaches stays. A conversation a call
-- holds right now (its row locked), or with a call in flight, is skipped -- a later pass takes it;
-- so is one gone meanwhile. Processes pruning at once skip each other's conversations likewise.
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

-- bp_apply_compaction: write a compaction node and point the conversation at it, in one
-- transaction -- or write nothing. Modes:
--   'turn'       the call's own synchronous compaction: it must still hold the lease; its pending
--                node moves under the compaction node, and the head moves to it;
--   'transform', 'full'  the same for a call without a lease (a side call, a full-history call): its
--                node moves under the compaction node; the head moves only if it still is the node
--                compacted from and no turn is in flight;
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
        v_move := true;
    ELSIF p_mode IN ('transform', 'full') THEN
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
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent,
                       model, provider, params, usage, compacted_from, depth, finished_at,
                       summariser_request, request_hash, chain, answered, system_hash)
    VALUES (p_tree, p_node, p_tenant, p_conversation, NULL, 'compaction', 'success', p_sent,
            p_model, p_provider, coalesce(p_params, '{}'::jsonb), p_usage, p_compacted_from, 0, clock_timestamp(),
            p_request, sha256(p_request), v_from.chain, coalesce(v_from.answered, false), p_system_hash);
    IF p_call_node IS NOT NULL THEN
        UPDATE nodes n SET parent_id = p_node, depth = 1
         WHERE n.tree_id = p_tree AND n.id = p_call_node AND n.outcome IS NULL;
    END IF;
    UPDATE conversations c
       SET compactions = c.compactions + 1,
           head_node_id = CASE WHEN v_move THEN p_node ELSE c.head_node_id END,
           updated_at = clock_timestamp()
     WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation;
    RETURN 'ok';
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
