-- 0023: large repeated items stored once per tenant (docs/architecture.md#shared-items).
--
-- Why: a coding agent sends the same system prompt and the same tool definitions with every
-- session, and a node kept its request's fields whole: Claude Code's 32-61 KB of tools were written
-- again with every node, Codex's ~18 KB of instructions with every session. Such a value is now
-- stored once per tenant here, keyed by the sha256 of its canonical JSON (hex), and a node holds
-- {"_bp_shared": "<hash>"} in its place (storage/shared.py). `seen_at`: when a process last wrote
-- or touched the row -- an item nothing refers to goes only once it has not been seen for a while,
-- so a process about to refer to it never finds it gone.
--
-- The expression index finds the nodes that refer to an item (the sweep): the references are
-- whole items of `sent` and whole values of `params`, and nothing else has that key (a client's
-- `_bp_` keys are refused). storage/queries.py's SHARED_REFERRED repeats the expression.

CREATE TABLE IF NOT EXISTS shared_items (
    tenant text NOT NULL,
    hash text NOT NULL,
    item jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, hash)
);

CREATE INDEX IF NOT EXISTS nodes_shared_refs ON nodes
    USING gin ((jsonb_path_query_array(sent, '$[*]._bp_shared') || jsonb_path_query_array(params, '$.*._bp_shared')));
