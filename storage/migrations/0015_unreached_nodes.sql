-- 0015: nodes that no conversation of their tree reaches are deleted.
--
-- Why: a conversation and its fork deleted at the same moment each saw the other still there,
-- kept the nodes it reached, and both went: those nodes stayed, readable by id through the admin
-- and Responses APIs, and retention never looked at them again. Deletes in a tree are serialised
-- now (bp_lock_tree_deletes, storage/functions/moves.sql); this takes what the race left behind.
-- The same query as bp_unreached_nodes (storage/functions/retention.sql), which `branchpoint
-- check` runs; written out here because the functions are applied after the migrations. Only the
-- nodes whose conversation is gone are walked. A node nothing reaches has no child anything
-- reaches, so they all go in one statement.

WITH RECURSIVE stray AS MATERIALIZED (
    SELECT n.tree_id, n.id, n.parent_id, n.compacted_from FROM nodes n
     WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.tree_id = n.tree_id AND c.tenant = n.tenant
                                                      AND c.id = n.conversation_id)
), pointed AS (
    SELECT k.tree_id, x.id FROM nodes k
      JOIN conversations c ON c.tree_id = k.tree_id AND c.tenant = k.tenant AND c.id = k.conversation_id
     CROSS JOIN LATERAL (VALUES (k.parent_id), (k.compacted_from)) x(id)
     WHERE k.tree_id IN (SELECT s.tree_id FROM stray s) AND x.id IS NOT NULL
    UNION
    SELECT c.tree_id, x.id FROM conversations c CROSS JOIN LATERAL (VALUES (c.head_node_id), (c.fork_node_id)) x(id)
     WHERE c.tree_id IN (SELECT s.tree_id FROM stray s) AND x.id IS NOT NULL
), reached AS (
    SELECT s.tree_id, s.id, s.parent_id, s.compacted_from FROM stray s
      JOIN pointed p ON p.tree_id = s.tree_id AND p.id = s.id
    UNION
    SELECT s.tree_id, s.id, s.parent_id, s.compacted_from FROM reached r
      JOIN stray s ON s.tree_id = r.tree_id AND s.id IN (r.parent_id, r.compacted_from)
)
DELETE FROM nodes n
 USING stray s
 WHERE n.tree_id = s.tree_id AND n.id = s.id
   AND NOT EXISTS (SELECT 1 FROM reached r WHERE r.tree_id = s.tree_id AND r.id = s.id);
