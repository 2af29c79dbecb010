"""The statements of a stored call's path (``storage/tree.py``): its start and finish (one round trip
each, batched: ``storage/batching.py``), its lease, the reaper's, the path read for assembly, a
compaction written, and the node a full-history call continues -- with the text forms its arrays
are sent in (``uuid_array``, ``bytea_array``).
"""

import uuid
from collections.abc import Iterable

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

# Keep a failed attempt of a pending call that is tried again as a node of its own.  $1 tree,
# $2 the pending node, $3 the parent the attempt hung under, $4 the attempt's id, $5 its error
# (jsonb), $6 the sha256 of what it sent
RECORD_ATTEMPT = """
SELECT bp_record_attempt(p_tree => $1, p_node => $2, p_parent => $3, p_attempt => $4, p_error => $5,
                         p_request_hash => $6)
"""

# A node's params (e.g. a compaction node's format).  $1 tree, $2 node
NODE_PARAMS = "SELECT params FROM nodes WHERE tree_id = $1 AND id = $2"

# A node's transcript hash (storage/transcript.py): what the items after it continue.  $1 tree, $2 node
NODE_CHAIN = "SELECT chain FROM nodes WHERE tree_id = $1 AND id = $2"

# A stateless client resuming from a compaction item (docs/behaviour.md#the-responses-api): the
# deepest node whose transcript is the anchor's followed by the first k of the messages the client
# sent after it -- in the tree, never a transform, and one the conversation can see (its own, or
# one of ``visible``: those of the conversation it forks). Each prefix one probe of the transcript
# index. Ties: as CONTINUED_NODE.
# $1 tenant, $2 tree, $3 conversation, $4 the prefix hashes folded from the anchor's (text
# '\x<hex>': ``bytea_array``), $5 the visible nodes of other conversations (``uuid_array``)
RESUMED_NODE = """
SELECT m.id, p.k::integer AS k
  FROM unnest($4::text[]::bytea[]) WITH ORDINALITY AS p(chain, k)
 CROSS JOIN LATERAL (
       SELECT n.id FROM nodes n
        WHERE n.chain = p.chain AND n.tenant = $1 AND n.tree_id = $2 AND n.kind <> 'transform'
          AND (n.conversation_id = $3 OR n.id = ANY($5::text::uuid[]))
        ORDER BY (n.kind = 'compaction') DESC, n.created_at DESC, n.id DESC
        LIMIT 1) m
 ORDER BY p.k DESC
 LIMIT 1
"""

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
