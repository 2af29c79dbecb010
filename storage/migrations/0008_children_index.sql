-- 0008: the children index no longer ends with the node id.
--
-- Why: with `id` as its last column, nodes_by_parent (tree_id, parent_id, created_at, id) could
-- answer a primary-key lookup (tree_id, id) by scanning every entry of the tree, and on tables
-- whose statistics lag behind their growth the planner sometimes chose exactly that -- for path
-- walks and for the foreign-key checks of every insert -- costing O(tree size) per lookup.
-- Children are still found, and ordered by creation, through (tree_id, parent_id, created_at).

DROP INDEX nodes_by_parent;
CREATE INDEX nodes_by_parent ON nodes (tree_id, parent_id, created_at);

-- bp_reap gained a third parameter (p_abandoned); the two-parameter one goes
DROP FUNCTION IF EXISTS bp_reap(uuid, uuid);
