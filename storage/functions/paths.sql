-- Server-side functions, part 2 of 6: reading the tree -- paths, what a conversation can see (its
-- own nodes, and for a fork what it reaches in its source), whether a node lies on the head path or
-- before a compaction. Read-only.
--
-- Refusals: none raised -- callers refuse on what these answer (BPNFN, BPPBC: calls.sql, moves.sql).
-- Locks: none taken -- callers lock the conversation row first when the answer must hold.
--
-- Every tree walk below is a recursive CTE whose step is one primary-key lookup, written as a
-- LATERAL subquery with LIMIT: the LIMIT keeps the planner from flattening it into a join it
-- may then run the wrong way round -- scanning the whole tree once per step, quadratic in the
-- path length (measured on a table whose statistics lagged behind its growth: 16 ms instead of
-- 0.2 ms for a 20-node path with 1,500 siblings, 140 ms instead of 3 ms for 1,000 nodes). The
-- SET clauses keep hash and merge joins, which never pay off for a walk, out as well.

-- bp_path(tree, node): the path from `node` to its root, root first, whole rows (admin API,
-- replay). One recursive CTE carrying the rows: for the admin API's reads of whole paths it
-- measured faster than walking ids and joining back (bench/tree_reads.py).
CREATE OR REPLACE FUNCTION bp_path(p_tree uuid, p_node uuid)
RETURNS SETOF nodes
LANGUAGE plpgsql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE up (node, lvl) AS (
        SELECT first, 0 FROM nodes first WHERE first.tree_id = p_tree AND first.id = p_node
        UNION ALL
        SELECT step.parent, up.lvl + 1 FROM up
         CROSS JOIN LATERAL (SELECT parent FROM nodes parent  -- LIMIT: a fence, one PK lookup per step
                              WHERE parent.tree_id = p_tree AND parent.id = (up.node).parent_id LIMIT 1) step
    )
    SELECT (up.node).* FROM up ORDER BY up.lvl DESC;
END
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
LANGUAGE plpgsql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
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
      FROM up ORDER BY up.lvl DESC;
END
$$;

-- bp_siblings(tree, node, parent, kind, created, compacted from, conversation, visible): a path
-- node's place among its siblings (1-based) and how many there are -- the nodes of the same kind
-- under the same parent (a turn and items added without a call are of one kind here, as the
-- branch arrows, bp_switch, move between them: an item DELETE's branch begins with an items node
-- beside the turn it copies); for a root, the conversation's roots of its kind; for a compaction node,
-- those replacing the same node -- counting only nodes the conversation can see (its own and
-- `visible`). The admin path read calls it per node of bp_path (one tree: one shard on Citus).
-- Its plan is the generic one, always: each call is a few index probes (~20 us), and planning it
-- anew costs ~0.1 ms -- which PostgreSQL chose to do on every call once the table held 10 million
-- nodes (its estimate of the generic plan grew with the table), making a 1,000-node path read 2.5x
-- slower (bench/tree_reads.py --fill). (On a schema distributed by Citus the setting is reset: Citus
-- routes each call by its values, storage/migrate.py suit_citus.)
CREATE OR REPLACE FUNCTION bp_siblings(p_tree uuid, p_node uuid, p_parent uuid, p_kind text, p_created timestamptz,
                                       p_compacted_from uuid, p_conversation text, p_visible uuid[],
                                       OUT sibling_index integer, OUT sibling_count integer)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    SELECT coalesce(sum(i), 0)::int, coalesce(sum(c), 0)::int INTO sibling_index, sibling_count FROM (
        SELECT count(*) FILTER (WHERE (n.created_at, n.id) <= (p_created, p_node)) AS i, count(*) AS c
          FROM nodes n
         WHERE p_parent IS NOT NULL AND n.tree_id = p_tree AND n.parent_id = p_parent
           AND (n.kind = p_kind OR (p_kind IN ('turn', 'items') AND n.kind IN ('turn', 'items')))
           AND (n.conversation_id = p_conversation OR n.id = ANY(p_visible))
        UNION ALL
        SELECT count(*) FILTER (WHERE (n.created_at, n.id) <= (p_created, p_node)), count(*)
          FROM nodes n
         WHERE p_parent IS NULL AND p_kind <> 'compaction' AND n.tree_id = p_tree AND n.parent_id IS NULL
           AND (n.kind = p_kind OR (p_kind IN ('turn', 'items') AND n.kind IN ('turn', 'items')))
           AND (n.conversation_id = p_conversation OR n.id = ANY(p_visible))
        UNION ALL
        SELECT count(*) FILTER (WHERE (n.created_at, n.id) <= (p_created, p_node)), count(*)
          FROM nodes n
         WHERE p_kind = 'compaction' AND n.tree_id = p_tree AND n.kind = 'compaction'
           AND n.compacted_from = p_compacted_from AND (n.conversation_id = p_conversation OR n.id = ANY(p_visible))
    ) parts;
END
$$;

-- bp_visible_foreign(tree, tenant, conversation): the nodes another conversation made that this
-- one can see -- everything on the paths of its own nodes, its head and its fork point (a fork
-- reaches back into its source; compaction originals included, so they can be unfolded).
-- Empty for a conversation that is not a fork: only forks share a tree.
CREATE OR REPLACE FUNCTION bp_visible_foreign(p_tree uuid, p_tenant text, p_conversation text)
RETURNS SETOF uuid
LANGUAGE plpgsql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
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
       AND up.conversation_id <> p_conversation;
END
$$;

-- bp_node_in_conversation(tree, tenant, conversation, node): the rule for every node a request
-- names (a parent, a new head, a switch or fork start): made by this conversation, or visible
-- to it (bp_visible_foreign, walked only for a node another conversation made).
CREATE OR REPLACE FUNCTION bp_node_in_conversation(p_tree uuid, p_tenant text, p_conversation text, p_node uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_conversation text;
BEGIN
    SELECT n.conversation_id INTO v_conversation FROM nodes n
     WHERE n.tree_id = p_tree AND n.id = p_node AND n.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_conversation = p_conversation THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM bp_visible_foreign(p_tree, p_tenant, p_conversation) f WHERE f = p_node);
END
$$;

-- bp_parent_through_compaction(tree, head, node): where a call naming `node` as its parent hangs,
-- given the summaries on the head's path. `node` itself when it is on the current path, or no
-- summary lies between (a clearing of old tool results, params.method = 'clear_tool_results', is
-- no barrier: it compacted no question away). The summary that replaced the path up to `node`,
-- when `node` is its tip (what it was compacted from): continuing from the last answer a summary
-- stands for is continuing from the summary -- a client that names its last response
-- (previous_response_id) after a compaction moved the head. Else null: `node` lies before a
-- summary and can no longer be edited here.
CREATE OR REPLACE FUNCTION bp_parent_through_compaction(p_tree uuid, p_head uuid, p_node uuid)
RETURNS uuid
LANGUAGE plpgsql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
DECLARE
    v_phase int;
    v_summary uuid;
BEGIN
    WITH RECURSIVE hist AS (
        SELECT n.id, n.parent_id, n.compacted_from, CASE WHEN n.kind = 'compaction' THEN n.params ->> 'method' END AS method, 0 AS phase
          FROM nodes n WHERE n.tree_id = p_tree AND n.id = p_head
        UNION ALL
        SELECT step.id, step.parent_id, step.compacted_from, step.method,
               hist.phase + CASE WHEN hist.parent_id IS NULL
                                  AND hist.method IS DISTINCT FROM 'clear_tool_results' THEN 1 ELSE 0 END
          FROM hist CROSS JOIN LATERAL (
              SELECT n.id, n.parent_id, n.compacted_from, CASE WHEN n.kind = 'compaction' THEN n.params ->> 'method' END AS method FROM nodes n
               WHERE n.tree_id = p_tree AND n.id = coalesce(hist.parent_id, hist.compacted_from) LIMIT 1) step
    )
    SELECT min(phase) FILTER (WHERE id = p_node),
           (array_agg(id) FILTER (WHERE phase = 0 AND parent_id IS NULL AND compacted_from = p_node
                                  AND method IS DISTINCT FROM 'clear_tool_results'))[1]
      INTO v_phase, v_summary FROM hist;
    IF v_phase IS NULL OR v_phase = 0 THEN
        RETURN p_node;
    END IF;
    RETURN v_summary;
END
$$;

-- bp_on_head_path(tree, tenant, conversation, node): does `node` lie on the head path of the
-- conversation (in `tree`)? Walks up from the head only as far as the node's depth (depth falls
-- by one per step).
CREATE OR REPLACE FUNCTION bp_on_head_path(p_tree uuid, p_tenant text, p_conversation text, p_node uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_bitmapscan = off
AS $$
DECLARE
    v boolean;
BEGIN
    WITH RECURSIVE target AS (
        SELECT c.tree_id, c.head_node_id, n.depth
          FROM conversations c JOIN nodes n ON n.tree_id = p_tree AND n.id = p_node
         WHERE c.tree_id = p_tree AND c.tenant = p_tenant AND c.id = p_conversation
    ), up AS (
        SELECT n.id, n.parent_id, n.depth FROM target t JOIN nodes n ON n.tree_id = p_tree AND n.id = t.head_node_id
         WHERE n.depth >= t.depth
        UNION ALL
        SELECT step.id, step.parent_id, step.depth FROM up, target t
         CROSS JOIN LATERAL (SELECT n.id, n.parent_id, n.depth FROM nodes n  -- (p_tree: what Citus routes a recursive CTE by)
                              WHERE n.tree_id = p_tree AND n.id = up.parent_id LIMIT 1) step
         WHERE up.depth > t.depth
    )
    SELECT true INTO v FROM up WHERE up.id = p_node LIMIT 1;
    RETURN coalesce(v, false);
END
$$;
