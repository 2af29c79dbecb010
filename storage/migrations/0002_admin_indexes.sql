-- 0002: indexes for the admin operations on trees shared by forks.
--
-- Why: deleting a conversation must find the other conversations of its tree (forks) to keep
-- what they still reach, and walking a branch down ("switch") or unfolding a compaction follows
-- compaction nodes by the node they replaced.

CREATE INDEX conversations_by_tree ON conversations (tree_id);
CREATE INDEX nodes_by_compacted_from ON nodes (tree_id, compacted_from) WHERE compacted_from IS NOT NULL;
