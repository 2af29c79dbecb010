"""The statements of looking after the data rather than serving calls: token usage reports, a
conversation's export and import (both run by ``storage/admin.py``), and those ``storage/ops.py``
runs -- retention's (``proxy/retention.py``), readiness and the pending gauge, and the invariants
``branchpoint check`` and the fault tests look at.
"""

from ..model import NodeRow, columns

# ---- usage ------------------------------------------------------------------------------------

# Token usage by tenant and model of the calls made between $2 (inclusive) and $3 (exclusive),
# in the conversations of tenant $1 (null: every tenant -- admin keys): calls, prompt, completion
# and cached tokens (bp_prompt_tokens, bp_cached_tokens: storage/functions/basics.sql). Nodes that
# called no model -- items added by the Conversations API, a clearing, a summary written again on
# another branch (params.reused_summary: paid for and counted as the node it names) -- are no calls;
# nor is an imported fork's copy of a node of its source (params._bp_inherited: counted there).
USAGE = """
SELECT c.tenant, n.model, count(*) AS calls,
       bp_token_total(sum(bp_prompt_tokens(n.usage))) AS prompt_tokens,
       bp_token_total(sum(bp_token_count(n.usage, 'completion_tokens', 'output_tokens'))) AS completion_tokens,
       bp_token_total(sum(bp_cached_tokens(n.usage))) AS cached_tokens
  FROM conversations c
  JOIN nodes n ON n.conversation_id = c.id AND n.tenant = c.tenant AND n.tree_id = c.tree_id
 WHERE ($1::text IS NULL OR c.tenant = $1) AND n.created_at >= $2 AND n.created_at < $3
   AND n.kind <> 'items' AND NOT n.params ? '_bp_inherited'
   AND NOT (n.kind = 'compaction' AND (n.params->>'method' = 'clear_tool_results' OR n.params ? 'reused_summary'))
 GROUP BY c.tenant, n.model
 ORDER BY c.tenant, n.model NULLS LAST
"""

# ---- retention --------------------------------------------------------------------------------

# Retention: the next $5 conversations not updated since $1, oldest first, after the key ($2
# updated_at, $3 tenant, $4 id; nulls: from the start) -- candidates only (a side call may have
# made one recent): bp_prune looks again. One scan of conversations without evaluating anything else.
IDLE_CANDIDATES = """
SELECT tree_id, tenant, id, updated_at FROM conversations
 WHERE updated_at < $1
   AND ($2::timestamptz IS NULL OR (updated_at, tenant, id) > ($2::timestamptz, $3::text, $4::text))
 ORDER BY updated_at, tenant, id
 LIMIT $5
"""

# Retention: delete those of the conversations named by $2 trees, $3 tenants, $4 ids that are idle
# since $1 (bp_prune).
PRUNE = "SELECT conversations, deleted, kept FROM bp_prune(p_cutoff => $1, p_trees => $2, p_tenants => $3, p_ids => $4)"

# Retention's preview: how many conversations are idle since $1 (bp_is_idle's test: not updated
# since, no node made since), and how many nodes they made. Each conversation grouped with its
# nodes by its key (on Citus: on its own shard, every shard at once).
IDLE_COUNT = """
SELECT count(*) AS conversations, coalesce(sum(s.nodes), 0)::bigint AS nodes
  FROM (SELECT count(n.id) AS nodes, max(n.created_at) AS newest
          FROM conversations cv
          LEFT JOIN nodes n ON n.tree_id = cv.tree_id AND n.tenant = cv.tenant AND n.conversation_id = cv.id
         WHERE cv.updated_at < $1
         GROUP BY cv.tree_id, cv.tenant, cv.id) s
 WHERE s.newest IS NULL OR s.newest < $1
"""

# ---- export and import ------------------------------------------------------------------------

_NODE = columns(NodeRow, "n")

# Every node of a conversation (and those of its source it can see), oldest first, all fields:
# the export, a page at a time.  $1 tree, $2 tenant, $3 conversation, $4 visible foreign,
# $5 created_at and $6 id of the last node of the previous page (nulls: the first page), $7 page size
EXPORT = f"""
SELECT {_NODE} FROM nodes n
 WHERE n.tree_id = $1 AND ((n.tenant = $2 AND n.conversation_id = $3) OR n.id = ANY($4))
   AND ($5::timestamptz IS NULL OR (n.created_at, n.id) > ($5::timestamptz, $6::uuid))
 ORDER BY n.created_at, n.id
 LIMIT $7
"""

# Re-create an exported tree as a new conversation of a tenant: in the tree its name gives it
# (bp_claim_name; $3 if that one is still used), node ids already remapped by the caller; nothing
# is written if the conversation id is taken.
# $1 tenant, $2 conversation, $3 spare tree, $4 head, $5 compactions, $6 nodes (jsonb array of
# objects), $7 the conversation's metadata, $8 when it was made (null: now)
IMPORT_TREE = """
WITH claim AS (
    SELECT bp_claim_name($1, $2, $3) AS tree_id
), conv AS (
    INSERT INTO conversations (tenant, id, tree_id, head_node_id, compactions, metadata, created_at)
    SELECT $1, $2, claim.tree_id, $4, $5, $7, coalesce($8::timestamptz, clock_timestamp())
      FROM claim WHERE claim.tree_id IS NOT NULL
    RETURNING tree_id
), ins AS (
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, received,
                       model, provider, params, usage, finish_reason, error, compacted_from, depth,
                       created_at, finished_at, chain, answered, system_hash, api, answer, response_deleted,
                       request_hash, summariser_request)
    SELECT conv.tree_id, r.id, $1, $2, r.parent_id, r.kind, r.outcome, r.sent, r.received, r.model, r.provider,
           coalesce(r.params, '{}'::jsonb), r.usage, r.finish_reason, r.error, r.compacted_from, r.depth,
           r.created_at, r.finished_at, decode(r.chain, 'hex'), r.answered, decode(r.system_hash, 'hex'),
           coalesce(r.api, 'chat'), decode(r.answer, 'hex'), coalesce(r.response_deleted, false),
           decode(r.request_hash, 'hex'), convert_to(r.summariser_request, 'UTF8')
      FROM conv, jsonb_to_recordset($6) AS r(
           id uuid, parent_id uuid, kind text, outcome text, sent jsonb, received jsonb,
           model text, provider text, params jsonb, usage jsonb, finish_reason text, error jsonb,
           compacted_from uuid, depth integer, created_at timestamptz, finished_at timestamptz,
           chain text, answered boolean, system_hash text, api text, answer text, response_deleted boolean,
           request_hash text, summariser_request text)
    RETURNING 1
)
SELECT (SELECT count(*) FROM conv) AS created, (SELECT count(*) FROM ins) AS nodes
"""

# ---- operations -------------------------------------------------------------------------------

# The schema version the database is at, and whether it takes writes -- not a standby, nor
# default_transaction_read_only set (readiness: a read-only database refuses every call's start).
READINESS = """
SELECT coalesce(max(version), 0) AS version, current_setting('transaction_read_only') = 'off' AS writable
  FROM schema_migrations
"""

# Pending nodes in the database, every process (a gauge).
PENDING_COUNT = "SELECT count(*) FROM nodes WHERE lease_until IS NOT NULL"  # = pending: nodes_pending_lease

# ---- invariants (``branchpoint check``, the fault tests) -------------------------------------

# Heads that point outside their conversation's tree.
HEADS_OUTSIDE_TREE = """
SELECT c.id, c.head_node_id FROM conversations c
 WHERE c.head_node_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.tree_id = c.tree_id AND n.id = c.head_node_id)
"""

# Successful turn/transform nodes without received items (compaction and items nodes receive nothing).
SUCCESS_WITHOUT_RECEIVED = """
SELECT id, conversation_id FROM nodes
 WHERE outcome = 'success' AND kind NOT IN ('compaction', 'items') AND received IS NULL
"""

# Pending nodes whose lease ran out more than $1 seconds ago (the reaper's job).
STALE_PENDING = """
SELECT id, conversation_id, lease_until FROM nodes
 WHERE outcome IS NULL AND lease_until < now() - make_interval(secs => $1)
"""

# Conversation leases that ran out more than $1 seconds ago.
STALE_LEASES = """
SELECT c.id, c.lease_node_id FROM conversations c
 WHERE c.lease_node_id IS NOT NULL AND c.lease_until < now() - make_interval(secs => $1)
"""

# Every head, for the pairing check of its assembled request.  $1 limit
HEADS = "SELECT tenant, id, tree_id, head_node_id FROM conversations WHERE head_node_id IS NOT NULL LIMIT $1"
