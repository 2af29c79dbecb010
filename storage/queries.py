"""Every SQL statement Branchpoint runs, named, each with its purpose and its ``$n`` parameters.

Plain SQL, parameters always bound (never formatted in; the only composition is of column lists
taken from the row structs of ``storage.model``, and of the fixed conversation queries that
``_conversations`` gives their counts). The multi-step statements are server-side
functions in ``functions/*.sql`` (in the order ``functions.sql`` lists them), called with named
arguments, so their parameter lists are documented there only.
"""

import uuid
from collections.abc import Iterable

from .model import ConversationRow, NodeRow, TreeRow, columns

# ---- the call path ----------------------------------------------------------------------------

# Start a call (conversation, lease, parent, pending node, path read: one round trip).
# $1 the call's start (storage.tree.CallStart, jsonb), $2 the nodes whose path this process keeps.
# The first column is the new node's id, which tells the calls of a batch apart (storage/batching.py).
# The path node's fields as columns of their own (storage.model.PathNode's order), not the composite
# bp_path_node: a composite column makes asyncpg introspect its type on every new connection --
# seconds each on a Citus coordinator under load, where it collapsed throughput (docs/scaling.md).
# For the same reason $2 is sent as text ('{id,...}': ``uuid_array``) and cast here: asyncpg has no
# built-in codec for uuid[] and would introspect it on every new connection too.
_BEGUN = """
SELECT call_node, conversation_id, tree_id, parent_id, mode, matched, start, with_system,
       (node).id AS node_id, (node).parent_id AS node_parent_id, (node).kind, (node).status, (node).sent,
       (node).received, (node).provider, (node).model, (node).usage, (node).compacted_from, (node).api"""
BEGIN_CALL = _BEGUN + """
  FROM bp_begin_call(p_start => $1, p_known => $2::text::uuid[])
"""

# Start a named conversation's call beside its tree (a schema distributed by tree: the call runs on
# the worker holding it).  $1 the tree (also the start's tree_id), $2 and $3 as BEGIN_CALL's $1, $2.
# Its rows as BEGIN_CALL's, or one row of mode 'elsewhere' (storage.tree.TreeStore.begin_call).
BEGIN_CALL_AT = _BEGUN + """
  FROM bp_begin_call_at(p_tree => $1, p_start => $2, p_known => $3)
"""


def uuid_array(ids: Iterable[uuid.UUID]) -> str:
    """Node ids as a PostgreSQL array literal, sent as text and cast in SQL (``BEGIN_CALL``)."""
    return "{" + ",".join(str(i) for i in ids) + "}"


def bytea_array(values: Iterable[bytes]) -> list[str]:
    """Byte strings in bytea's hex input form, sent as text[] and cast in SQL (``CONTINUED_NODE``)."""
    return ["\\x" + v.hex() for v in values]

# Store a call's outcome, release the lease, move the head by the head rule.
# $1 tree, $2 node, $3 how it ended (storage.tree.CallFinish, jsonb); the first column: as in BEGIN_CALL.
# (The call in FROM: on Citus the statement is then sent whole to the worker holding the tree.)
FINISH_CALL = """
SELECT $2::uuid AS call, finished FROM bp_finish_call(p_tree => $1, p_node => $2, p_finish => $3) AS finished
"""

# Keep a live call's leases from running out.  $1 tree, $2 node, $3 lease seconds
RENEW_LEASE = "SELECT bp_renew(p_tree => $1, p_node => $2, p_lease_seconds => $3)"

# Pending nodes whose lease ran out (their process died), oldest first.  $1 limit
EXPIRED_PENDING = """
SELECT tree_id, id FROM nodes
 WHERE outcome IS NULL AND lease_until < now()
 ORDER BY lease_until
 LIMIT $1
"""

# Mark one expired pending node failed/interrupted (and make a turn node the head).  $1 tree, $2 node
REAP_NODE = "SELECT bp_reap(p_tree => $1, p_node => $2)"

# A call whose start was not confirmed in time: reap its node now if it exists.  $1 node
ABANDON = "SELECT bp_abandon(p_node => $1)"

# The path from a node to its top, root first, as assembly reads it.  $1 tree, $2 node
PATH_NODES = "SELECT * FROM bp_path_nodes(p_tree => $1, p_node => $2)"

# Write a compaction node and point the conversation at it, or write nothing.
APPLY_COMPACTION = """
SELECT bp_apply_compaction(
    p_tenant => $1, p_conversation => $2, p_tree => $3, p_node => $4, p_compacted_from => $5,
    p_sent => $6, p_system_hash => $7, p_model => $8, p_provider => $9, p_params => $10, p_usage => $11,
    p_mode => $12, p_call_node => $13, p_request => $14)
"""

# A node's params (e.g. a compaction node's format).  $1 tree, $2 node
NODE_PARAMS = "SELECT params FROM nodes WHERE tree_id = $1 AND id = $2"

# Where a conversation's head is, and whether a turn call is in flight.  $1 tenant, $2 conversation
CONVERSATION_STATE = "SELECT head_node_id, busy FROM bp_conversation_state(p_tenant => $1, p_conversation => $2)"

# A session that continues another one (docs/behaviour.md#full-history-mode): the deepest node of
# the tenant whose transcript hash is one of a full-history call's prefix hashes, never a
# transform -- the node the call continues, read before a conversation's first call (nothing is
# started). Ties: a compaction node over the node it replaced, then the newest.
# $1 tenant, $2 the prefix hashes h_1..h_m (storage.transcript.prefix_hashes) as text ('\x<hex>':
# ``bytea_array``; asyncpg would introspect bytea[] on every new connection, as BEGIN_CALL's uuid[]);
# k: the matched prefix
CONTINUED_NODE = """
SELECT n.id, n.conversation_id, n.parent_id, n.outcome, p.k::integer AS k
  FROM unnest($2::text[]::bytea[]) WITH ORDINALITY AS p(chain, k)
  JOIN nodes n ON n.chain = p.chain AND n.tenant = $1 AND n.kind <> 'transform'
 ORDER BY p.k DESC, (n.kind = 'compaction') DESC, n.created_at DESC, n.id DESC
 LIMIT 1
"""

# ---- the Conversations API (storage/functions/conversations.sql) ------------------------------

# Items added without a call: nodes of kind 'items', the head moved to the last.
# $1 tenant, $2 conversation, $3 spare tree, $4 create, $5 metadata, $6 parent mode, $7 parent,
# $8 expected head, $9 the nodes (jsonb)
ADD_ITEMS = """
SELECT bp_add_items(p_tenant => $1, p_conversation => $2, p_spare => $3, p_create => $4, p_metadata => $5,
                    p_parent_mode => $6, p_parent => $7, p_expected_head => $8, p_nodes => $9)
"""

# Replace a conversation's metadata.  $1 tenant, $2 conversation, $3 metadata
SET_METADATA = "SELECT bp_set_metadata(p_tenant => $1, p_conversation => $2, p_metadata => $3)"

# A conversation's metadata and creation time (no row: no such conversation).  $1 tenant, $2 conversation
CONVERSATION_METADATA = "SELECT metadata, created_at FROM bp_conversation_row($1, $2)"

# ---- admin API --------------------------------------------------------------------------------

def _conversations(chosen: str, order: str = "") -> str:
    """Conversation rows with their counts: the conversations ``chosen`` (a query over
    ``conversations``: a filter, an order, a limit) first, the counts only for those -- each
    conversation's from its own tree (bp_conversation_counts: on Citus, one shard each)."""
    return f"""
SELECT {columns(ConversationRow, "c", skip=("busy", "node_count", "prompt_tokens", "completion_tokens",
                                              "cached_tokens"))},
       (c.lease_node_id IS NOT NULL AND c.lease_until > now()) AS busy,
       s.node_count, s.prompt_tokens, s.completion_tokens, s.cached_tokens
  FROM ({chosen}) c
 CROSS JOIN LATERAL bp_conversation_counts(c.tree_id, c.tenant, c.id) s
 {order}
"""


# One conversation, with its node count and token usage.  $1 tenant, $2 conversation
CONVERSATION = _conversations("SELECT * FROM bp_conversation_row($1, $2)")

# A page of conversations, newest first, after the cursor (created_at, id), optionally only ids
# containing a search string (case-insensitive).
# $1 tenant (null: every tenant -- admin keys), $2 cursor created_at (null: first page), $3 cursor id, $4 limit,
# $5 search (null: all)
CONVERSATIONS_PAGE = _conversations("""
SELECT * FROM conversations c
 WHERE ($1::text IS NULL OR c.tenant = $1) AND ($2::timestamptz IS NULL OR (c.created_at, c.id) < ($2, $3))
   AND ($5::text IS NULL OR strpos(lower(c.id), lower($5)) > 0)
 ORDER BY c.created_at DESC, c.id DESC
 LIMIT $4""", order="ORDER BY c.created_at DESC, c.id DESC")

# The nodes whose messages hold these words, best match first: the conversation that made each
# (still there), a snippet around the words, the rank. The expression is the one migration 0021
# indexes.  $1 tenant (null: every tenant -- admin keys), $2 the words, $3 limit
SEARCH = """
SELECT n.conversation_id, n.id AS node_id, n.created_at,
       ts_rank(jsonb_to_tsvector('simple'::regconfig, n.sent || coalesce(n.received, '[]'::jsonb), '["string"]'),
               plainto_tsquery('simple'::regconfig, $2)) AS rank,
       ts_headline('simple'::regconfig,
                   -- (the snippet from what was said: texts, contents, tool arguments and results, not keys or roles)
                   coalesce((SELECT string_agg(t.value #>> '{}', ' … ')
                               FROM unnest(ARRAY['strict $.**.content', 'strict $.**.text', 'strict $.**.arguments',
                                                 'strict $.**.output', 'strict $.**.thinking']::jsonpath[]) AS p(path),
                                    jsonb_path_query(n.sent || coalesce(n.received, '[]'::jsonb), p.path) AS t(value)
                              WHERE jsonb_typeof(t.value) = 'string'), ''),
                   plainto_tsquery('simple'::regconfig, $2),
                   'StartSel=«, StopSel=», MaxWords=18, MinWords=6, MaxFragments=1') AS snippet
  FROM nodes n
  JOIN conversations c ON c.tree_id = n.tree_id AND c.id = n.conversation_id AND c.tenant = n.tenant
 WHERE ($1::text IS NULL OR n.tenant = $1)
   AND jsonb_to_tsvector('simple'::regconfig, n.sent || coalesce(n.received, '[]'::jsonb), '["string"]')
       @@ plainto_tsquery('simple'::regconfig, $2)
 ORDER BY rank DESC, n.created_at DESC
 LIMIT $3
"""

# A node's prompt tokens in any API's terms: chat's prompt_tokens, Responses' input_tokens, and
# Anthropic's input_tokens with its cache reads and writes, which its input_tokens leave out (no
# cache key: nothing added). As proxy/tokens.py's reported_prompt reads them.
PROMPT_TOKENS = """coalesce(bp_token_count(n.usage, 'prompt_tokens', 'prompt_tokens'),
         bp_token_count(n.usage, 'input_tokens', 'input_tokens')
         + coalesce(bp_token_count(n.usage, 'cache_read_input_tokens', 'cache_read_input_tokens'), 0)
         + coalesce(bp_token_count(n.usage, 'cache_creation_input_tokens', 'cache_creation_input_tokens'), 0))"""
# The share of them a provider's prompt cache served: chat's prompt_tokens_details.cached_tokens,
# Responses' input_tokens_details.cached_tokens, Anthropic's cache_read_input_tokens.
CACHED_TOKENS = """coalesce(bp_token_count(n.usage -> 'prompt_tokens_details', 'cached_tokens', 'cached_tokens'),
         bp_token_count(n.usage -> 'input_tokens_details', 'cached_tokens', 'cached_tokens'),
         bp_token_count(n.usage, 'cache_read_input_tokens', 'cache_read_input_tokens'))"""

# Token usage by tenant and model of the calls made between $2 (inclusive) and $3 (exclusive),
# in the conversations of tenant $1 (null: every tenant -- admin keys): calls, prompt, completion
# and cached tokens (PROMPT_TOKENS, CACHED_TOKENS).
USAGE = f"""
SELECT c.tenant, n.model, count(*) AS calls,
       bp_token_total(sum({PROMPT_TOKENS})) AS prompt_tokens,
       bp_token_total(sum(bp_token_count(n.usage, 'completion_tokens', 'output_tokens'))) AS completion_tokens,
       bp_token_total(sum({CACHED_TOKENS})) AS cached_tokens
  FROM conversations c
  JOIN nodes n ON n.conversation_id = c.id AND n.tenant = c.tenant AND n.tree_id = c.tree_id
 WHERE ($1::text IS NULL OR c.tenant = $1) AND n.created_at >= $2 AND n.created_at < $3
 GROUP BY c.tenant, n.model
 ORDER BY c.tenant, n.model NULLS LAST
"""

# The tenants that have a conversation of this id (the CLI resolves an id without a tenant).  $1 id
TENANTS_OF = "SELECT tenant FROM conversations WHERE id = $1 ORDER BY tenant"

# Move the head (null: clear).  $1 tenant, $2 conversation, $3 node
SET_HEAD = "SELECT bp_set_head(p_tenant => $1, p_conversation => $2, p_node => $3)"

# Branch arrows: from a node down to the newest leaf; returns the new head.  $1 tenant, $2 conversation, $3 node
SWITCH = "SELECT bp_switch(p_tenant => $1, p_conversation => $2, p_node => $3)"

# Fork; returns the fork's head.  $1 tenant, $2 source, $3 new id, $4 node, $5 use the source's head
FORK = "SELECT bp_fork(p_tenant => $1, p_source => $2, p_new => $3, p_node => $4, p_use_head => $5)"

# Delete a conversation, keeping what forks still reach.  $1 tenant, $2 conversation
DELETE_CONVERSATION = "SELECT deleted, kept FROM bp_delete_conversation(p_tenant => $1, p_conversation => $2)"

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

# The nodes of other conversations this one can see (forks only).  $1 tree, $2 tenant, $3 conversation
VISIBLE_FOREIGN = "SELECT array(SELECT bp_visible_foreign($1, $2, $3))"

_NODE = columns(NodeRow, "n")
_P_NODE = columns(NodeRow, "p")

# The head path, root first, each node with its place among its siblings (same kind, same parent;
# roots among the conversation's roots; compaction nodes among those replacing the same node),
# counting only nodes this conversation can see.
# $1 tree, $2 head, $3 conversation, $4 visible foreign node ids
PATH_WITH_SIBLINGS = f"""
SELECT {_P_NODE}, s.sibling_index, s.sibling_count
  FROM bp_path($1, $2) WITH ORDINALITY p
 CROSS JOIN LATERAL bp_siblings($1, p.id, p.parent_id, p.kind, p.created_at, p.compacted_from, $3, $4) s
 ORDER BY p.ordinality
"""

# A path, root first, whole rows (replay of a node's request).  $1 tree, $2 node
PATH = f"SELECT {_P_NODE} FROM bp_path($1, $2) p"

# Every node of a conversation (and the nodes of its source it can see), oldest first, with a
# short preview instead of the full items.  $1 tree, $2 tenant, $3 conversation, $4 visible foreign
TREE = f"""
SELECT {columns(TreeRow, "n", skip=("method", "preview"))},
       CASE WHEN n.kind = 'compaction' THEN coalesce(n.params ->> 'method', 'summary') END AS method,
       left(coalesce(n.received -> 0 -> 'content' -> 0 ->> 'text', n.received -> 0 ->> 'content',
                     n.received -> 0 -> 'tool_calls' -> 0 -> 'function' ->> 'name' || '(…)',
                     n.received -> 0 ->> 'name' || '(…)',
                     n.sent -> -1 -> 'content' -> 0 ->> 'text', n.sent -> -1 ->> 'content'), 200) AS preview
  FROM nodes n
 WHERE n.tree_id = $1 AND ((n.tenant = $2 AND n.conversation_id = $3) OR n.id = ANY($4))
 ORDER BY n.created_at, n.id
"""

# One node of the caller's tenant.  $1 node, $2 tenant (null: any tenant -- admin keys)
NODE = f"SELECT {_NODE} FROM nodes n WHERE n.id = $1 AND ($2::text IS NULL OR n.tenant = $2)"

# DELETE /v1/responses/{id}: 'deleted', 'withdrawn' or 'not_found'.  $1 tenant, $2 node
DELETE_RESPONSE = "SELECT bp_delete_response(p_tenant => $1, p_node => $2)"

# A compaction node's kept summariser request.  $1 tree, $2 node
SUMMARISER_REQUEST = "SELECT summariser_request FROM nodes WHERE tree_id = $1 AND id = $2"

# The children of a node, oldest first.  $1 tree, $2 node, $3 tenant
CHILDREN = f"""
SELECT {_NODE} FROM nodes n
 WHERE n.tree_id = $1 AND n.parent_id = $2 AND n.tenant = $3
 ORDER BY n.created_at, n.id
"""

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
# $1 tenant, $2 conversation, $3 spare tree, $4 head, $5 compactions, $6 nodes (jsonb array of objects)
IMPORT_TREE = """
WITH claim AS (
    SELECT bp_claim_name($1, $2, $3) AS tree_id
), conv AS (
    INSERT INTO conversations (tenant, id, tree_id, head_node_id, compactions)
    SELECT $1, $2, claim.tree_id, $4, $5 FROM claim WHERE claim.tree_id IS NOT NULL
    RETURNING tree_id
), ins AS (
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, outcome, sent, received,
                       model, provider, params, usage, finish_reason, error, compacted_from, depth,
                       created_at, finished_at, chain, answered, system_hash, api)
    SELECT conv.tree_id, r.id, $1, $2, r.parent_id, r.kind, r.outcome, r.sent, r.received, r.model, r.provider,
           coalesce(r.params, '{}'::jsonb), r.usage, r.finish_reason, r.error, r.compacted_from, r.depth,
           r.created_at, r.finished_at, decode(r.chain, 'hex'), r.answered, decode(r.system_hash, 'hex'),
           coalesce(r.api, 'chat')
      FROM conv, jsonb_to_recordset($6) AS r(
           id uuid, parent_id uuid, kind text, outcome text, sent jsonb, received jsonb,
           model text, provider text, params jsonb, usage jsonb, finish_reason text, error jsonb,
           compacted_from uuid, depth integer, created_at timestamptz, finished_at timestamptz,
           chain text, answered boolean, system_hash text, api text)
    RETURNING 1
)
SELECT (SELECT count(*) FROM conv) AS created, (SELECT count(*) FROM ins) AS nodes
"""

# ---- operations -------------------------------------------------------------------------------

# The schema version the database is at (readiness).
SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM schema_migrations"

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

# ---- shared items (storage/shared.py, migration 0023) ------------------------------------------

# Store shared values, or mark them seen when they are there.  $1 tenant, $2 {hash: value} (jsonb)
# (seen_at from EXCLUDED, not now() in DO UPDATE: Citus takes only immutable functions there --
# docs/scaling.md#past-one-postgresql)
SHARED_STORE = """
INSERT INTO shared_items (tenant, hash, item, seen_at)
SELECT $1, v.key, v.value, now() FROM jsonb_each($2::jsonb) AS v
ON CONFLICT (tenant, hash) DO UPDATE SET seen_at = EXCLUDED.seen_at
"""

# The values of these hashes.  $1 tenant, $2 hashes
SHARED_LOAD = "SELECT hash, item FROM shared_items WHERE tenant = $1 AND hash = ANY($2::text[])"

# A page of shared items not seen for a while, in key order after ($2, $3).  $1 seconds, $4 page size
SHARED_CANDIDATES = """
SELECT tenant, hash FROM shared_items
 WHERE seen_at < now() - make_interval(secs => $1) AND (tenant, hash) > ($2, $3)
 ORDER BY tenant, hash LIMIT $4
"""

# Which of these hashes nodes of the tenant still refer to (migration 0023's index).  $1 tenant, $2 hashes
SHARED_REFERRED = """
SELECT DISTINCT r.ref
  FROM nodes n,
       jsonb_array_elements_text(jsonb_path_query_array(n.sent, '$[*]._bp_shared')
                                 || jsonb_path_query_array(n.params, '$.*._bp_shared')) AS r(ref)
 WHERE n.tenant = $1
   AND (jsonb_path_query_array(n.sent, '$[*]._bp_shared') || jsonb_path_query_array(n.params, '$.*._bp_shared'))
       ?| $2::text[]
   AND r.ref = ANY($2::text[])
"""

# Mark these shared items seen now (nodes still refer to them).  $1 tenant, $2 hashes
SHARED_SEEN = "UPDATE shared_items SET seen_at = now() WHERE tenant = $1 AND hash = ANY($2::text[])"

# Delete these shared items if still unseen.  $1 tenant, $2 hashes, $3 seconds
SHARED_DELETE = """
DELETE FROM shared_items
 WHERE tenant = $1 AND hash = ANY($2::text[]) AND seen_at < now() - make_interval(secs => $3)
"""
