"""The statements of large items stored once per tenant (``storage/shared.py``, migration 0023):
stored or marked seen, loaded, and swept when no node refers to them any more.
"""

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
