"""0027: the text-search index over bp_search_vector (storage/functions/search.sql) -- what a node
says, without its attachments and bounded -- instead of every string of the node (0021).

Why: 0021 indexed jsonb_to_tsvector over every string of a node's items, attachments included. Random
base64 (an image or a PDF as a data URL or a `source`, an upstream's audio answer) and unique tokens
(a lockfile's integrity hashes read as a tool result) split into as many distinct lexemes as they
have bytes, and past PostgreSQL's 1 MB of lexemes a vector is refused (54000): the start of a call
with an attachment over ~700 KB failed with 500 `storage_error` before the upstream was called,
and a big audio answer was stored failed -- the conversation could not go on. bp_search_vector
leaves attachments out and indexes a bounded part of the rest, so any node can be stored.

Python, not SQL: the index needs the function, and the functions are applied after the migrations
(storage/migrate.py) -- this applies search.sql first, so the function has one definition. The new
index is built beside the old one and takes its name after: writes wait while it is built (as for
0021), reads do not -- the old index is dropped, which locks the table whole, only at the end. A
plain CREATE INDEX (not CONCURRENTLY, which runs outside a transaction), as 0021's: Citus
propagates it to the shards; the function reads no table and calls only built-ins, so Citus can
create it on every node first."""

from importlib import resources


async def upgrade(conn):
    await conn.execute(resources.files("storage").joinpath("functions", "search.sql").read_text(encoding="utf-8"))
    await conn.execute("CREATE INDEX nodes_text_search_bounded ON nodes USING gin (bp_search_vector(sent, received))")
    await conn.execute("DROP INDEX IF EXISTS nodes_text_search")
    await conn.execute("ALTER INDEX nodes_text_search_bounded RENAME TO nodes_text_search")
