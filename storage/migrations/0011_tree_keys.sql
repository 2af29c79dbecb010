-- 0011: every call's rows on one tree_id -- keys a distributed PostgreSQL can co-locate.
--
-- Why: a call writes its conversation row (lease, head) and its node. Keyed (tenant, id) and
-- (tree_id, id), the two would land on different shards of a PostgreSQL distributed by tree_id
-- (Citus), and every call would be a two-shard transaction. Now a conversation's tree_id is
-- derived from its name -- bp_tree_of(tenant, id), a name-based UUID -- and the conversation row
-- is keyed (tree_id, tenant, id), so it sits beside its nodes. A conversation that cannot live at
-- its derived tree -- a fork, which shares its source's tree, or a conversation made again under
-- the name of a deleted one whose tree forks still use -- has an alias row at its derived tree
-- pointing to the tree it lives in: one extra lookup for those, none for the others
-- (docs/scaling.md#past-one-postgresql).
--
-- Existing rows are carried over: each tree is renamed after its owner (the conversation that
-- is not a fork; else the oldest), the other conversations of the tree get alias rows.

CREATE FUNCTION bp_tree_of(p_tenant text, p_conversation text)
RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(length(p_tenant)::text || ':' || p_tenant || p_conversation)::uuid
$$;

CREATE TABLE conversation_aliases (
    tree_id uuid NOT NULL,  -- bp_tree_of(tenant, id): where the name is looked up
    tenant  text NOT NULL,
    id      text NOT NULL,
    target  uuid NOT NULL,  -- the tree the conversation lives in
    PRIMARY KEY (tree_id, tenant, id)
);

CREATE TEMP TABLE tree_map ON COMMIT DROP AS
SELECT DISTINCT ON (c.tree_id) c.tree_id AS old, bp_tree_of(c.tenant, c.id) AS new
  FROM conversations c
 ORDER BY c.tree_id, (c.fork_node_id IS NOT NULL), c.created_at, c.tenant, c.id;

INSERT INTO conversation_aliases (tree_id, tenant, id, target)
SELECT bp_tree_of(c.tenant, c.id), c.tenant, c.id, m.new
  FROM conversations c JOIN tree_map m ON m.old = c.tree_id
 WHERE bp_tree_of(c.tenant, c.id) <> m.new;

-- one statement per table: the foreign keys are checked when each statement has renamed all rows
ALTER TABLE nodes DROP CONSTRAINT nodes_tree_id_parent_id_fkey;
ALTER TABLE nodes DROP CONSTRAINT nodes_tree_id_compacted_from_fkey;
UPDATE nodes n SET tree_id = m.new FROM tree_map m WHERE n.tree_id = m.old AND m.new <> m.old;
UPDATE conversations c SET tree_id = m.new FROM tree_map m WHERE c.tree_id = m.old AND m.new <> m.old;
ALTER TABLE nodes ADD FOREIGN KEY (tree_id, parent_id) REFERENCES nodes (tree_id, id);
ALTER TABLE nodes ADD FOREIGN KEY (tree_id, compacted_from) REFERENCES nodes (tree_id, id);

ALTER TABLE conversations DROP CONSTRAINT conversations_pkey;
ALTER TABLE conversations ADD PRIMARY KEY (tree_id, tenant, id);
DROP INDEX conversations_by_tree;  -- the primary key's first column now
-- admin and CLI lookups by name across trees (not on a call's path)
CREATE INDEX conversations_by_name ON conversations (tenant, id);
-- full-history matching inside a named conversation's tree (nodes_by_chain stays for /auto/v1,
-- which looks across the tenant's trees)
CREATE INDEX nodes_by_tree_chain ON nodes (tree_id, chain);

DROP FUNCTION IF EXISTS bp_on_head_path(text, text, uuid);

DROP FUNCTION IF EXISTS bp_path_up(uuid, uuid, uuid[]);
