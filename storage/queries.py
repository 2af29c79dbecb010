"""Every SQL statement the proxy runs, named, with its purpose and its ``$n`` parameters.

Plain SQL, parameters always bound (never formatted in). The multi-step statements live as
server-side functions in ``functions.sql``; their contracts are documented there.
"""

# Start a call: conversation upsert, lease, parent choice, pending node, path read (one round trip).
# $1 tenant, $2 conversation, $3 new tree id, $4 node id, $5 kind, $6 parent mode, $7 parent id,
# $8 sent, $9 sent hash, $10 lease seconds, $11 model, $12 provider, $13 params
BEGIN_CALL = "SELECT * FROM bp_begin_call($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"

# Store a call's outcome, release the lease, move the head if told to.
# $1 tree, $2 node, $3 status, $4 received, $5 usage, $6 finish_reason, $7 error,
# $8 request hash, $9 move head
FINISH_CALL = "SELECT bp_finish_call($1, $2, $3, $4, $5, $6, $7, $8, $9)"

# Keep a live call's leases from running out.  $1 tree, $2 node, $3 lease seconds
RENEW_LEASE = "SELECT bp_renew($1, $2, $3)"

# Pending nodes whose lease ran out (their process died), oldest first.  $1 limit
EXPIRED_PENDING = """
SELECT tree_id, id FROM nodes
 WHERE status = 'pending' AND lease_until < now()
 ORDER BY lease_until
 LIMIT $1
"""

# Mark one expired pending node failed/interrupted (and make a turn node the head).  $1 tree, $2 node
REAP_NODE = "SELECT bp_reap($1, $2)"

# The path from a node to its top, root first.  $1 tree, $2 node
PATH = "SELECT * FROM bp_path($1, $2)"

# ---- admin API ------------------------------------------------------------------------------

_CONVERSATION_FIELDS = """
    c.tenant, c.id, c.tree_id, c.head_node_id, c.forked_from, c.fork_node_id, c.created_at, c.updated_at,
    (c.lease_node_id IS NOT NULL AND c.lease_until > now()) AS busy,
    (SELECT count(*) FROM nodes n WHERE n.tenant = c.tenant AND n.conversation_id = c.id
                                     AND n.tree_id = c.tree_id) AS node_count
"""

# One conversation.  $1 tenant, $2 conversation
CONVERSATION = f"SELECT {_CONVERSATION_FIELDS} FROM conversations c WHERE c.tenant = $1 AND c.id = $2"

# A page of conversations, newest first, after the cursor (created_at, id).
# $1 tenant (null: every tenant -- admin keys), $2 cursor created_at (null: first page), $3 cursor id, $4 limit
CONVERSATIONS_PAGE = f"""
SELECT {_CONVERSATION_FIELDS} FROM conversations c
 WHERE ($1::text IS NULL OR c.tenant = $1) AND ($2::timestamptz IS NULL OR (c.created_at, c.id) < ($2, $3))
 ORDER BY c.created_at DESC, c.id DESC
 LIMIT $4
"""

# Move the head.  $1 tenant, $2 conversation, $3 node (null: clear)
SET_HEAD = "SELECT bp_set_head($1, $2, $3)"

# Branch arrows: from a node down to the newest leaf.  $1 tenant, $2 conversation, $3 node
SWITCH = "SELECT * FROM bp_switch($1, $2, $3)"

# Fork.  $1 tenant, $2 source, $3 new id, $4 node, $5 use the source's head
FORK = "SELECT * FROM bp_fork($1, $2, $3, $4, $5)"

# Delete a conversation, keeping what forks still reach.  $1 tenant, $2 conversation
DELETE_CONVERSATION = "SELECT * FROM bp_delete_conversation($1, $2)"

# The nodes of other conversations this one can see (forks only).  $1 tree, $2 tenant, $3 conversation
VISIBLE_FOREIGN = "SELECT array(SELECT bp_visible_foreign($1, $2, $3))"

_NODE_FIELDS = """
    n.id, n.conversation_id, n.parent_id, n.kind, n.status, n.sent, n.received, n.model, n.provider,
    n.params, n.usage, n.finish_reason, n.error, n.compacted_from, n.depth, n.created_at, n.finished_at
"""

# The head path, root first, each node with its place among its siblings (same kind, same parent;
# roots among the conversation's roots; compaction nodes among those replacing the same node),
# counting only nodes this conversation can see.
# $1 tree, $2 head, $3 conversation, $4 visible foreign node ids
PATH_WITH_SIBLINGS = f"""
SELECT {_NODE_FIELDS.replace("n.", "p.")}, s.sibling_index, s.sibling_count
  FROM bp_path($1, $2) WITH ORDINALITY p
  CROSS JOIN LATERAL (
      SELECT coalesce(sum(i), 0)::int AS sibling_index, coalesce(sum(c), 0)::int AS sibling_count FROM (
          SELECT count(*) FILTER (WHERE (n.created_at, n.id) <= (p.created_at, p.id)) AS i, count(*) AS c
            FROM nodes n
           WHERE p.parent_id IS NOT NULL AND n.tree_id = $1 AND n.parent_id = p.parent_id AND n.kind = p.kind
             AND (n.conversation_id = $3 OR n.id = ANY($4))
          UNION ALL
          SELECT count(*) FILTER (WHERE (n.created_at, n.id) <= (p.created_at, p.id)), count(*)
            FROM nodes n
           WHERE p.parent_id IS NULL AND p.kind <> 'compaction' AND n.tree_id = $1 AND n.parent_id IS NULL
             AND n.kind = p.kind AND (n.conversation_id = $3 OR n.id = ANY($4))
          UNION ALL
          SELECT count(*) FILTER (WHERE (n.created_at, n.id) <= (p.created_at, p.id)), count(*)
            FROM nodes n
           WHERE p.kind = 'compaction' AND n.tree_id = $1 AND n.kind = 'compaction'
             AND n.compacted_from = p.compacted_from AND (n.conversation_id = $3 OR n.id = ANY($4))
      ) parts
  ) s
 ORDER BY p.ordinality
"""

# Every node of a conversation (and the nodes of its source it can see), oldest first, with a
# short preview instead of the full items.  $1 tree, $2 tenant, $3 conversation, $4 visible foreign
TREE = """
SELECT n.id, n.conversation_id, n.parent_id, n.kind, n.status, n.model, n.usage, n.created_at,
       n.finish_reason, n.compacted_from,
       left(coalesce(n.received -> 0 ->> 'content', n.sent -> -1 ->> 'content'), 200) AS preview
  FROM nodes n
 WHERE n.tree_id = $1 AND ((n.tenant = $2 AND n.conversation_id = $3) OR n.id = ANY($4))
 ORDER BY n.created_at, n.id
"""

# One node of the caller's tenant.  $1 node, $2 tenant (null: any tenant -- admin keys)
NODE = f"""
SELECT {_NODE_FIELDS}, n.tenant, n.tree_id, n.request_hash, n.summariser_request FROM nodes n
 WHERE n.id = $1 AND ($2::text IS NULL OR n.tenant = $2)
"""

# The children of a node, oldest first.  $1 tree, $2 node, $3 tenant
CHILDREN = f"""
SELECT {_NODE_FIELDS} FROM nodes n
 WHERE n.tree_id = $1 AND n.parent_id = $2 AND n.tenant = $3
 ORDER BY n.created_at, n.id
"""

# ---- compaction -----------------------------------------------------------------------------

# Write a compaction node and point the conversation at it, or write nothing.
# $1 tenant, $2 conversation, $3 tree, $4 node, $5 compacted_from, $6 sent, $7 sent hash, $8 model,
# $9 provider, $10 params, $11 usage, $12 mode, $13 call node, $14 the summariser's (first) request
APPLY_COMPACTION = "SELECT bp_apply_compaction($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"

# A node's params (e.g. a compaction node's format).  $1 tree, $2 node
NODE_PARAMS = "SELECT params FROM nodes WHERE tree_id = $1 AND id = $2"

# Where a conversation's head is, and whether a turn call is in flight.  $1 tenant, $2 conversation
CONVERSATION_STATE = """
SELECT head_node_id, (lease_node_id IS NOT NULL AND lease_until > now()) AS busy
  FROM conversations WHERE tenant = $1 AND id = $2
"""

# Every node of a conversation (and those of its source it can see), oldest first, all fields:
# the export.  $1 tree, $2 tenant, $3 conversation, $4 visible foreign
EXPORT = f"""
SELECT {_NODE_FIELDS} FROM nodes n
 WHERE n.tree_id = $1 AND ((n.tenant = $2 AND n.conversation_id = $3) OR n.id = ANY($4))
 ORDER BY n.created_at, n.id
"""

# Re-create an exported tree as a new conversation of a tenant: a new tree, node ids already
# remapped by the caller; nothing is written if the conversation id is taken.
# $1 tenant, $2 conversation, $3 tree, $4 head, $5 compactions, $6 nodes (jsonb array of objects)
IMPORT_TREE = """
WITH conv AS (
    INSERT INTO conversations (tenant, id, tree_id, head_node_id, compactions) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (tenant, id) DO NOTHING
    RETURNING tree_id
), ins AS (
    INSERT INTO nodes (tree_id, id, tenant, conversation_id, parent_id, kind, status, sent, sent_hash, received,
                       model, provider, params, usage, finish_reason, error, compacted_from, depth,
                       created_at, finished_at)
    SELECT conv.tree_id, r.id, $1, $2, r.parent_id, r.kind, r.status, r.sent, decode(r.sent_hash, 'hex'),
           r.received, r.model, r.provider, coalesce(r.params, '{}'::jsonb), r.usage, r.finish_reason, r.error,
           r.compacted_from, r.depth, r.created_at, r.finished_at
      FROM conv, jsonb_to_recordset($6) AS r(
           id uuid, parent_id uuid, kind text, status text, sent jsonb, sent_hash text, received jsonb,
           model text, provider text, params jsonb, usage jsonb, finish_reason text, error jsonb,
           compacted_from uuid, depth integer, created_at timestamptz, finished_at timestamptz)
    RETURNING 1
)
SELECT (SELECT count(*) FROM conv) AS created, (SELECT count(*) FROM ins) AS nodes
"""
