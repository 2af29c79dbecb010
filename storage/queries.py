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
