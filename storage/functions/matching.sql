-- Server-side functions, part 4 of 6: full-history mode (docs/behaviour.md#full-history-mode) --
-- finding the node a resent history continues (bp_begin_full's probes of the transcript index;
-- bp_best_candidate when two candidates tie) and starting the call under it (bp_begin_full,
-- reached through bp_begin_call).
--
-- Refusals: none -- a history that matches nothing starts a new root (or a new conversation).
-- Locks: the conversation row FOR KEY SHARE (a named one when it is opened, a found one once it is
-- chosen): full-history calls take no lease and run side by side, but never beside a delete.

-- bp_tail(items, skip, with_system, ordinals): the items after the first `skip` non-system
-- messages, in their order; system/developer messages kept only when `with_system`. Chat
-- messages count one each; Responses items say, in `ordinals`, which message they stand for
-- (0: a system/developer message; several items can make one message).
-- Chat items whose system/developer messages all come first (none, or a prompt at the start:
-- almost every history) are cut with jsonpath slices, the system ones found by one strict jsonpath
-- filter (objects whose role is the string "system" or "developer", as the general query reads
-- them; a shared system item, {"_bp_shared": ..., "role": "system"} -- storage/shared.py -- is
-- one); any other layout goes through the general query.
CREATE OR REPLACE FUNCTION bp_tail(p_items jsonb, p_skip integer, p_with_system boolean, p_ordinals integer[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_sys jsonb;
    v_n integer;
BEGIN
    IF p_ordinals IS NULL AND jsonb_typeof(p_items) = 'array' THEN
        v_sys := jsonb_path_query_array(p_items, 'strict $[*] ? (@.role == "system" || @.role == "developer")');
        v_n := jsonb_array_length(v_sys);
        IF v_n = 0 OR jsonb_path_query_array(p_items, '$[0 to $k]', jsonb_build_object('k', v_n - 1)) = v_sys THEN
            RETURN CASE WHEN p_with_system THEN v_sys ELSE '[]'::jsonb END
                   || jsonb_path_query_array(p_items, '$[$k to last]', jsonb_build_object('k', v_n + greatest(p_skip, 0)));
        END IF;
    END IF;
    RETURN (SELECT coalesce(jsonb_agg(e.v ORDER BY e.i), '[]'::jsonb)
              FROM (SELECT x.v, x.i, x.sys,
                           coalesce(p_ordinals[x.i], count(*) FILTER (WHERE NOT x.sys) OVER (ORDER BY x.i)) AS nth
                      FROM (SELECT t.v, t.i, CASE WHEN p_ordinals IS NULL
                                                  THEN coalesce(t.v ->> 'role' IN ('system', 'developer'), false)
                                                  ELSE p_ordinals[t.i] = 0 END AS sys
                              FROM jsonb_array_elements(p_items) WITH ORDINALITY AS t(v, i)) x) e
             WHERE (e.sys AND p_with_system) OR (NOT e.sys AND e.nth > p_skip));
END
$$;

-- Conversations API objects: a call that names no conversation (/auto/v1, found by content) never
-- hangs in a conversation the Conversations API made (`POST /v1/conversations`, or
-- `/v1/responses/compact` from input alone: its id is `conv_` + 32 hex digits, an id the proxy
-- gives no other conversation). OpenAI's conversation holds what its items calls and the calls
-- naming it (`conversation`) put there, nothing else -- a client that keeps its history in one
-- (the Agents SDK's OpenAIConversationsSession: every run resends the listed items without naming
-- the conversation, then adds what is new through the items API) would otherwise find each new
-- turn in it twice, and send it twice from then on. A call naming it matches its nodes as usual.

-- bp_match_rows(tenant, conversation, tree, visible, chain, limit): the nodes whose transcript hash
-- is `chain` that a full-history call may hang under -- in the named conversation's reach (its
-- tree: its own nodes and the `visible` ones of its source: one shard on Citus), or, with no
-- conversation named, anywhere in the tenant (every shard); never a transform. A compaction node
-- first, then the newest; at most `limit` rows (null: all). bp_best_candidate takes the best of them.
CREATE OR REPLACE FUNCTION bp_match_rows(p_tenant text, p_conversation text, p_tree uuid, p_visible uuid[],
                                         p_chain bytea, p_limit integer)
RETURNS TABLE (id uuid, parent_id uuid, tree_id uuid, conversation_id text, outcome text, kind text,
               created_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    IF p_conversation IS NOT NULL THEN
        RETURN QUERY
        SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome, n.kind, n.created_at
          FROM nodes n
         WHERE n.tree_id = p_tree AND n.chain = p_chain AND n.kind <> 'transform' AND n.tenant = p_tenant
           AND (n.conversation_id = p_conversation OR n.id = ANY(p_visible))
         ORDER BY (n.kind = 'compaction') DESC, n.created_at DESC, n.id DESC
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome, n.kind, n.created_at
          FROM nodes n
         WHERE n.tenant = p_tenant AND n.chain = p_chain AND n.kind <> 'transform'
           AND n.conversation_id NOT LIKE 'conv\_%'  -- (not a Conversations API object's, above)
         ORDER BY (n.kind = 'compaction') DESC, n.created_at DESC, n.id DESC
         LIMIT p_limit;
    END IF;
END
$$;

-- bp_best_candidate(tenant, conversation, tree, visible, chain, pending): the node whose transcript
-- hash is `chain` that a full-history call hangs under when two candidates tie (bp_match_rows'
-- rows; a node still in flight only when `pending`): the first, in bp_match_rows' order (a
-- compaction node, then the newest), that lies on its conversation's head path; none on it: the
-- first. The head-path test walks the path (bp_on_head_path, from the head down to the node's
-- depth), so it runs candidate by candidate and stops at the first on it -- whatever the number
-- of candidates (under /auto/v1, every conversation of the tenant that began the same way: each
-- is usually on its own head path, so the first is taken at once). At most 32 candidates are
-- walked: past them the first (in that order) is taken, as when nothing ties -- a client retrying a history
-- that keeps failing leaves a failed attempt per retry, none on the head path (a refusal leaves
-- the head where it was), and each retry walked them all. The walk runs
-- here, never inside the candidates' query (on Citus that query runs on a shard, which cannot walk
-- the tree itself). (No SET clauses of its own, which would cost each call a settings change:
-- bp_begin_full's apply.)
CREATE OR REPLACE FUNCTION bp_best_candidate(p_tenant text, p_conversation text, p_tree uuid, p_visible uuid[],
                                             p_chain bytea, p_pending boolean)
RETURNS TABLE (id uuid, parent_id uuid, tree_id uuid, conversation_id text, outcome text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_first record;
    v_any boolean := false;  -- (a row holding a null -- a root's parent -- is neither NULL nor NOT NULL)
    v_walked integer := 0;
BEGIN
    -- (the 64 first are more than the walks can test)
    FOR r IN SELECT m.* FROM bp_match_rows(p_tenant, p_conversation, p_tree, p_visible, p_chain, 64) m
              ORDER BY (m.kind = 'compaction') DESC, m.created_at DESC, m.id DESC LOOP
        CONTINUE WHEN r.outcome IS NULL AND NOT p_pending;
        IF NOT v_any THEN
            v_first := r;
            v_any := true;
        END IF;
        EXIT WHEN v_walked >= 32;
        v_walked := v_walked + 1;
        IF bp_on_head_path(r.tree_id, p_tenant, coalesce(p_conversation, r.conversation_id), r.id) THEN
            v_first := r;
            EXIT;
        END IF;
    END LOOP;
    IF v_any THEN
        id := v_first.id; parent_id := v_first.parent_id; tree_id := v_first.tree_id;
        conversation_id := v_first.conversation_id; outcome := v_first.outcome;
        RETURN NEXT;
    END IF;
END
$$;

-- bp_begin_full(start, known): start a call in full-history mode (called by bp_begin_call; `start`
-- as bp_call_start_t reads it). The client sent its whole history; the parent is the node whose
-- transcript equals the longest start of it: candidates are the nodes whose transcript hash is
-- one of the client's prefix hashes (bp_match_rows' rows) -- the deepest wins; ties: as
-- bp_best_candidate takes the best of them. Nothing matched: a new root (a new conversation,
-- new_conversation_id, when none was named). Everything matched and the node failed (or is in
-- flight): the retry rule, beside it. The new node stores only what is new, and the client's
-- system messages when they differ from those in effect on the parent's path. No lease, no
-- conversation lock: concurrent calls become siblings. Returns rows as bp_begin_call does.
CREATE OR REPLACE FUNCTION bp_begin_full(p_start jsonb, p_known uuid[] DEFAULT '{}')
RETURNS TABLE (call_node uuid, conversation_id text, tree_id uuid, parent_id uuid, mode text, matched integer,
               start integer, with_system boolean, node bp_path_node)
LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    s bp_call_start_t := jsonb_populate_record(NULL::bp_call_start_t, p_start);
    conv conversations%ROWTYPE;
    v_given integer := coalesce(cardinality(s.prefixes), 0);
    v_m integer := s.prefix_offset + coalesce(cardinality(s.prefixes), 0);
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
    IF s.tree_id IS NOT NULL THEN
        -- run beside a tree (bp_begin_call_at): the conversation must be there
        conv := bp_conversation_at(s.tenant, s.conversation_id, s.tree_id, false);
        IF conv.id IS NULL THEN
            RETURN QUERY SELECT s.node_id, NULL::text, conv.tree_id, NULL::uuid, 'elsewhere', 0, 0, false,
                                NULL::bp_path_node;
            RETURN;
        END IF;
        IF conv.fork_node_id IS NOT NULL THEN
            v_visible := ARRAY(SELECT bp_visible_foreign(conv.tree_id, s.tenant, s.conversation_id));
        END IF;
    ELSIF s.conversation_id IS NOT NULL THEN
        -- key-share locked: calls run side by side, but never beside a delete of the conversation
        conv := bp_open_conversation(s.tenant, s.conversation_id, bp_conversation_tree(s.tenant, s.conversation_id),
                                     s.new_tree_id, false);
        IF conv.fork_node_id IS NOT NULL THEN
            v_visible := ARRAY(SELECT bp_visible_foreign(conv.tree_id, s.tenant, s.conversation_id));
        END IF;
    END IF;

    -- the deepest candidate: the prefixes probed from the longest down, one lookup on the
    -- transcript index (chain, tenant, tree_id) each, in this statement (a resent history almost
    -- always matches at the first or second): the best candidate first (in bp_match_rows' order:
    -- a compaction node, then the newest), a second row only to see whether it ties. The tie rules
    -- are only worked out when two candidates tie (a compaction and the node it replaced, a failed
    -- attempt and its retry ...): the head-path test walks the path. (One statement per prefix,
    -- not one for several: `chain = ANY(...)` let the planner prefer the key's tree prefix --
    -- every node of the tree -- whenever it thought trees small.) A node still in flight is a
    -- candidate only for the whole history (the retry rule hangs the call beside it): its
    -- transcript hash covers what it sent, and its answer, once stored, would join the path of a
    -- node hung under it -- an answer the client's history does not hold. A shorter prefix goes on
    -- to the node before it, and the call stores the in-flight node's messages again.
    FOR i IN REVERSE v_given..1 LOOP
        IF s.conversation_id IS NOT NULL THEN
            FOR v_row IN
                SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome
                  FROM nodes n
                 WHERE n.tree_id = conv.tree_id AND n.chain = s.prefixes[i] AND n.kind <> 'transform'
                   AND n.tenant = s.tenant AND (n.conversation_id = s.conversation_id OR n.id = ANY(v_visible))
                   AND (n.outcome IS NOT NULL OR i = v_given)
                 ORDER BY (n.kind = 'compaction') DESC, n.created_at DESC, n.id DESC
                 LIMIT 2 LOOP
                IF v_k = 0 THEN
                    v_best := v_row;
                    v_k := s.prefix_offset + i;
                ELSE
                    v_ties := 2;
                END IF;
            END LOOP;
        ELSE
            FOR v_row IN
                SELECT n.id, n.parent_id, n.tree_id, n.conversation_id, n.outcome
                  FROM nodes n
                 WHERE n.tenant = s.tenant AND n.chain = s.prefixes[i] AND n.kind <> 'transform'
                   AND (n.outcome IS NOT NULL OR i = v_given)
                   AND n.conversation_id NOT LIKE 'conv\_%'  -- (not a Conversations API object's)
                 ORDER BY (n.kind = 'compaction') DESC, n.created_at DESC, n.id DESC
                 LIMIT 2 LOOP
                IF v_k = 0 THEN
                    v_best := v_row;
                    v_k := s.prefix_offset + i;
                ELSE
                    v_ties := 2;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN v_k > 0;
    END LOOP;
    IF v_ties > 1 THEN  -- (the best the tie rules give that the probe could take)
        FOR v_row IN SELECT * FROM bp_best_candidate(s.tenant, s.conversation_id, conv.tree_id, v_visible,
                                                     s.prefixes[v_k - s.prefix_offset], v_k = v_m) LOOP
            v_best := v_row;
        END LOOP;
    END IF;
    IF v_k > 0 AND s.conversation_id IS NULL THEN
        SELECT * INTO conv FROM conversations c
         WHERE c.tree_id = v_best.tree_id AND c.tenant = s.tenant AND c.id = v_best.conversation_id FOR KEY SHARE;
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

    IF s.prefix_offset > 0 THEN
        -- a window at the end of the history was given: enough unless nothing matched in it, or
        -- the parent's own position (the retry rule) lies before it
        IF v_k = 0 THEN
            RETURN QUERY SELECT s.node_id, conv.id, conv.tree_id, NULL::uuid, 'window', 0, 0, false, NULL::bp_path_node;
            RETURN;
        END IF;
        IF v_parent IS DISTINCT FROM v_best.id AND (v_parent IS NULL OR NOT EXISTS (
                SELECT 1 FROM nodes n WHERE n.tree_id = v_best.tree_id AND n.id = v_parent AND n.chain = ANY(s.prefixes))) THEN
            RETURN QUERY SELECT s.node_id, conv.id, conv.tree_id, NULL::uuid, 'window', 0, 0, false, NULL::bp_path_node;
            RETURN;
        END IF;
    END IF;

    IF conv.id IS NULL THEN  -- no conversation named and nothing matched: a new one
        INSERT INTO conversations (tenant, id, tree_id)
        VALUES (s.tenant, s.new_conversation_id, bp_claim_name(s.tenant, s.new_conversation_id, s.new_tree_id))
        RETURNING * INTO conv;
    END IF;

    SELECT n.depth, n.chain, n.answered, n.system_hash INTO v_up
      FROM nodes n WHERE n.tree_id = conv.tree_id AND n.id = v_parent;
    IF v_parent IS NOT NULL THEN
        v_start := s.prefix_offset + coalesce(array_position(s.prefixes, v_up.chain), 0);
    END IF;
    v_with_system := s.system_hash IS NOT NULL AND s.system_hash IS DISTINCT FROM v_up.system_hash;
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, sent, model, provider, params,
                       depth, lease_until, chain, answered, system_hash, api)
    VALUES (conv.tree_id, s.node_id, s.tenant, conv.id, v_parent, s.kind,
            bp_tail(s.sent, v_start - s.prefix_offset, v_with_system, s.ordinals),
            s.model, s.provider, coalesce(s.params, '{}'::jsonb), coalesce(v_up.depth + 1, 0),
            now() + make_interval(secs => s.lease_seconds),
            CASE WHEN v_given = 0 THEN '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
                 ELSE s.prefixes[v_given] END,
            coalesce(v_up.answered, false),
            CASE WHEN v_with_system THEN s.system_hash ELSE v_up.system_hash END, s.api);

    RETURN QUERY SELECT s.node_id, conv.id, conv.tree_id, v_parent, 'full', v_k, v_start, v_with_system, p
      FROM bp_path_nodes(conv.tree_id, v_parent, p_known) p;
    IF NOT FOUND THEN
        RETURN QUERY SELECT s.node_id, conv.id, conv.tree_id, v_parent, 'full', v_k, v_start, v_with_system, NULL::bp_path_node;
    END IF;
END
$$;
