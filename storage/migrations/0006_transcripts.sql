-- 0006: nodes are indexed by the hash of their transcript.
--
-- Why: clients that resend their whole history (almost every app and agent framework) must be
-- matched onto the tree -- "the deepest node whose conversation so far equals the start of the
-- client's messages" -- in one indexed lookup, whatever the tree's size. Each node keeps the
-- hash chain of its transcript (storage/transcript.py explains the canonical form), filled for
-- existing nodes by the next migration, and an index serves both a conversation's lookup and a
-- tenant-wide one (/auto/v1). Retry recognition compares transcripts too, so the byte hash of
-- `sent` goes (in 0007).
--   chain        hash of the transcript through this node (a compaction node: of the one it replaced)
--   answered     whether that transcript holds an answer the proxy stored
--   system_hash  hash of the system prompt in effect on the node's path (null: none)

ALTER TABLE nodes ADD COLUMN chain bytea;
ALTER TABLE nodes ADD COLUMN answered boolean NOT NULL DEFAULT false;
ALTER TABLE nodes ADD COLUMN system_hash bytea;
ALTER TABLE nodes ALTER COLUMN sent_hash DROP NOT NULL;

CREATE INDEX nodes_by_chain ON nodes (tenant, chain);
