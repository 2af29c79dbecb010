-- 0001: the conversation tree (docs/architecture.md#tables).
--
-- Why: every LLM call is one row of `nodes`, hung under its parent; a conversation is only a
-- pointer (`head_node_id`) into that tree plus the in-flight lease of its running turn call.
-- Editing, retrying, branching, forking and compaction never copy or delete rows: they choose a
-- parent and move the pointer.
--
-- Keys: everything a request touches is reachable from (tenant, conversation id) -> tree_id, and
-- every node row is keyed by (tree_id, id). A fork inherits its source's tree_id, so one tree --
-- with all its forks -- can live on one shard of a distributed PostgreSQL (e.g. Citus, distributed
-- by tree_id) and the path query never crosses shards.

CREATE TABLE conversations (
    tenant          text        NOT NULL,              -- hash of the bearer key, or a configured tenant
    id              text        NOT NULL,              -- the client's conversation id
    tree_id         uuid        NOT NULL,              -- shard key; shared with forks of the same tree
    head_node_id    uuid,                              -- null until the first call (or after a clear)
    lease_node_id   uuid,                              -- the turn call in flight; null: none
    lease_until     timestamptz,                       -- a lease older than this belongs to a dead process
    forked_from     text,                              -- the source conversation of a fork
    fork_node_id    uuid,                              -- the node a fork started from
    compactions     integer     NOT NULL DEFAULT 0,    -- compaction nodes made for this conversation
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, id),
    CHECK (char_length(id) BETWEEN 1 AND 128),
    CHECK ((lease_node_id IS NULL) = (lease_until IS NULL))
);

-- GET /admin/conversations: newest first, keyset-paginated on (created_at, id)
CREATE INDEX conversations_by_created ON conversations (tenant, created_at DESC, id DESC);

CREATE TABLE nodes (
    tree_id         uuid        NOT NULL,
    id              uuid        NOT NULL,              -- UUIDv7: time-ordered
    tenant          text        NOT NULL,
    conversation_id text        NOT NULL,              -- the conversation whose call made it
    parent_id       uuid,                              -- null: a root, or a compaction node
    kind            text        NOT NULL CHECK (kind IN ('turn', 'transform', 'compaction')),
    status          text        NOT NULL CHECK (status IN ('pending', 'success', 'failed')),
    sent            jsonb       NOT NULL,              -- items this call newly sent
    sent_hash       bytea       NOT NULL,              -- sha256 of canonical `sent`: retry recognition
    received        jsonb,                             -- items the model returned (success only)
    model           text,
    provider        text,
    params          jsonb       NOT NULL DEFAULT '{}', -- the request's other fields, for audit/replay
    usage           jsonb,
    finish_reason   text,
    error           jsonb,                             -- {type, code, message, status} when failed
    compacted_from  uuid,                              -- compaction nodes: the node they replace
    depth           integer     NOT NULL,              -- ancestors up to the path's top (0 at the top)
    request_hash    bytea,                             -- sha256 of the exact body sent upstream
    lease_until     timestamptz,                       -- pending nodes: reaped as interrupted after this
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at     timestamptz,
    PRIMARY KEY (tree_id, id),
    FOREIGN KEY (tree_id, parent_id) REFERENCES nodes (tree_id, id),
    FOREIGN KEY (tree_id, compacted_from) REFERENCES nodes (tree_id, id),
    CHECK (kind <> 'compaction' OR (parent_id IS NULL AND compacted_from IS NOT NULL)),
    CHECK ((status = 'pending') = (lease_until IS NOT NULL))
);

-- admin lookups by node id alone (GET /admin/nodes/{id})
CREATE INDEX nodes_by_id ON nodes (id);
-- children of a node, oldest first (branch arrows, switch, subtree walks)
CREATE INDEX nodes_by_parent ON nodes (tree_id, parent_id, created_at, id);
-- every node a conversation made (tree view, delete)
CREATE INDEX nodes_by_conversation ON nodes (tenant, conversation_id, created_at, id);
-- the reaper: pending nodes whose lease ran out
CREATE INDEX nodes_pending_lease ON nodes (lease_until) WHERE status = 'pending';
