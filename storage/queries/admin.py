"""The statements of the Conversations and admin APIs (``storage/admin.py``): conversations with
their counts, a page of them, search, head moves, forks and deletes, paths, trees and nodes as
the admin API and the viewer read them, and items added without a call.
"""

from ..model import ConversationRow, NodeRow, TreeRow, columns

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
# (null when it was deleted and the node kept for the forks that reach it), a snippet around the
# words, the rank. The expression is the one migration 0027 indexes (bp_search_vector,
# storage/functions/search.sql).  $1 tenant (null: every tenant -- admin keys), $2 the words, $3 limit
SEARCH = """
SELECT n.tenant, c.id AS conversation_id, n.id AS node_id, n.created_at, n.tree_id,
       ts_rank(bp_search_vector(n.sent, n.received), plainto_tsquery('simple'::regconfig, $2)) AS rank,
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
  LEFT JOIN conversations c ON c.tree_id = n.tree_id AND c.id = n.conversation_id AND c.tenant = n.tenant
 WHERE ($1::text IS NULL OR n.tenant = $1)
   AND bp_search_vector(n.sent, n.received) @@ plainto_tsquery('simple'::regconfig, $2)
 ORDER BY rank DESC, n.created_at DESC
 LIMIT $3
"""

# The tenants that have a conversation of this id (the CLI resolves an id without a tenant).  $1 id
TENANTS_OF = "SELECT tenant FROM conversations WHERE id = $1 ORDER BY tenant"

# Move the head (null: clear).  $1 tenant, $2 conversation, $3 node
SET_HEAD = "SELECT bp_set_head(p_tenant => $1, p_conversation => $2, p_node => $3)"

# Branch arrows: from a node down to the newest leaf; returns the new head.  $1 tenant, $2 conversation, $3 node
SWITCH = "SELECT bp_switch(p_tenant => $1, p_conversation => $2, p_node => $3)"

# Fork; returns the fork's head.  $1 tenant, $2 source, $3 new id, $4 node, $5 use the source's head
FORK = "SELECT bp_fork(p_tenant => $1, p_source => $2, p_new => $3, p_node => $4, p_use_head => $5)"

# The same into a conversation that exists but has no node yet (bp_fork_into_empty).
# $1 tenant, $2 source, $3 the empty conversation, $4 node
FORK_INTO_EMPTY = "SELECT bp_fork_into_empty(p_tenant => $1, p_source => $2, p_target => $3, p_node => $4)"

# Delete a conversation, keeping what forks still reach.  $1 tenant, $2 conversation
DELETE_CONVERSATION = "SELECT deleted, kept FROM bp_delete_conversation(p_tenant => $1, p_conversation => $2)"

# The nodes of other conversations this one can see (forks only).  $1 tree, $2 tenant, $3 conversation
VISIBLE_FOREIGN = "SELECT array(SELECT bp_visible_foreign($1, $2, $3))"

# The forks of a tree (the conversations that may see nodes of another).  $1 tree, $2 tenant
FORKS_OF_TREE = "SELECT id FROM conversations WHERE tree_id = $1 AND tenant = $2 AND fork_node_id IS NOT NULL ORDER BY id"

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
       -- (the first answer item that says something: a Responses answer may begin with its reasoning)
       left(coalesce((SELECT p.said FROM jsonb_array_elements(CASE WHEN jsonb_typeof(n.received) = 'array'
                                                                   THEN n.received ELSE '[]' END) WITH ORDINALITY r(e, i),
                            LATERAL (SELECT coalesce(
                                jsonb_path_query_first(r.e, '$.content[*].text ? (@.type() == "string" && @ != "")') #>> '{{}}',
                                CASE WHEN jsonb_typeof(r.e -> 'content') = 'string' THEN nullif(r.e ->> 'content', '') END,
                                r.e -> 'tool_calls' -> 0 -> 'function' ->> 'name' || '(…)',
                                (jsonb_path_query_first(r.e, '$.content[*] ? (@.type == "tool_use").name') #>> '{{}}') || '(…)',
                                r.e ->> 'name' || '(…)') AS said) p
                       WHERE r.e ->> 'type' IS DISTINCT FROM 'reasoning' AND p.said <> ''
                       ORDER BY r.i LIMIT 1),
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
