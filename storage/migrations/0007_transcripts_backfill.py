"""0007: compute the transcript keys (chain, answered, system_hash) of the nodes that existed before
0006, tree by tree, then make `chain` required and drop `sent_hash` (retries are recognised by
transcript now). Python, not SQL: the keys come from the messages' canonical forms."""

import json


async def upgrade(conn):
    from storage.transcript import node_keys

    trees = [r["tree_id"] for r in await conn.fetch("SELECT DISTINCT tree_id FROM nodes WHERE chain IS NULL")]
    for tree in trees:
        rows = await conn.fetch(
            "SELECT id, parent_id, kind, outcome, sent::text AS sent, received::text AS received, compacted_from "
            "FROM nodes WHERE tree_id = $1", tree)
        nodes = [{**dict(r), "sent": json.loads(r["sent"]), "received": json.loads(r["received"]) if r["received"] else None}
                 for r in rows]
        keys = node_keys(nodes)
        await conn.executemany(
            "UPDATE nodes SET chain = $3, answered = $4, system_hash = $5 WHERE tree_id = $1 AND id = $2",
            [(tree, node_id, k.chain, k.answered, k.system_hash) for node_id, k in keys.items()])
    await conn.execute("ALTER TABLE nodes ALTER COLUMN chain SET NOT NULL")
    await conn.execute("ALTER TABLE nodes DROP COLUMN sent_hash")
