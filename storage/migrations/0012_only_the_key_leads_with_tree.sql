-- 0012: no secondary index of `nodes` starts with a column a primary-key lookup also names.
--
-- Why: a call looks its rows up by (tree_id, id) -- five or six times per call, plus the foreign
-- key's check of the parent. PL/pgSQL and the foreign-key checks keep their plans for the life
-- of a connection, planned with the statistics of that moment. On a young table (no statistics
-- yet) the planner found nodes_by_tree_chain (tree_id, chain) as cheap as the primary key for
-- `tree_id = $1 AND id = $2`: it scanned the whole tree's entries and filtered them by id, and the
-- connection kept that plan -- every lookup cost O(nodes in the tree) until the next ANALYZE
-- happened to invalidate it (a 1,000-node conversation: ~1,000 index entries per lookup). 0008
-- cured the children index of the same disease; this cures it for good: only the primary key
-- leads with tree_id, and nothing leads with tenant (which some lookups add), so a lookup by key
-- has no other index to mistake for it. Each reordered index still answers its own queries with
-- equality on its leading columns.
--
-- The reaper's index of pending nodes was partial on `outcome IS NULL` -- which the finish's
-- update also says, so on a young table the planner read that whole index (every pending entry,
-- and the dead ones of calls finished since the last vacuum) instead of the key. It is now
-- partial on `lease_until IS NOT NULL`: the same rows (a node is pending exactly while it has a
-- lease: nodes_pending_has_lease), implied by the reaper's `lease_until < now()`, never by a
-- lookup by key.
--
-- The two transcript indexes become one: (chain, tenant, tree_id) answers a lookup inside a tree
-- (all three given) and one across a tenant's trees (/auto/v1: chain and tenant) -- one index
-- entry less per stored call. (On a young table that lookup still ties with the primary key's
-- tree prefix -- a full-history call may then read its conversation's nodes -- until the first
-- ANALYZE, autovacuum's within a minute, re-plans it; while the table is young its trees are small.)
--
-- On a big table this rebuilds three indexes, and writes wait meanwhile: run `branchpoint migrate`
-- before rolling out (README).
DROP INDEX nodes_by_tree_chain;
DROP INDEX nodes_by_chain;
CREATE INDEX nodes_by_chain ON nodes (chain, tenant, tree_id);

DROP INDEX nodes_by_parent;
CREATE INDEX nodes_by_parent ON nodes (parent_id, tree_id, created_at);

DROP INDEX nodes_pending_lease;
CREATE INDEX nodes_pending_lease ON nodes (lease_until) WHERE lease_until IS NOT NULL;

DROP INDEX nodes_by_conversation;
CREATE INDEX nodes_by_conversation ON nodes (conversation_id, tenant, created_at, id);
