"""The test databases on a Citus cluster (``BRANCHPOINT_TEST_DATABASE_URL`` at a coordinator, as
.ci/citus.sh runs the suite): what tests/conftest.py does to make a database there.

Citus keeps its metadata per database, and a distributed database is one database of that name on
every node. So a new test database is made on the coordinator and on each worker, Citus is created
in each and the workers registered in the coordinator's (as ../shared/citus/cluster.sh registers
them in its first database); the migrated template is distributed (``branchpoint distribute``);
and a clone of it (``fresh_database_url``) is a ``CREATE DATABASE ... TEMPLATE`` on every node --
the coordinator's metadata and the workers' shards copied alike, same shard ids, same placements.
Citus's maintenance daemon keeps a connection to every Citus database, which ``TEMPLATE`` refuses:
the template's sessions are ended first (nothing else uses it).

Plain PostgreSQL (the embedded one, or a server without Citus): ``cluster`` answers None and
conftest makes its databases as before."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import asyncpg

__all__ = ["Cluster", "cluster"]


@dataclass(frozen=True)
class Cluster:
    """A Citus coordinator at ``url`` and its nodes (host, port, group; the coordinator's group is 0)."""

    url: str
    nodes: tuple[tuple[str, int, int], ...]

    @property
    def workers(self) -> list[tuple[str, int]]:
        return [(host, port) for host, port, group in self.nodes if group != 0]

    def node_url(self, host: str, port: int, database: str | None = None) -> str:
        parts = urlsplit(self.url)
        user = f"{parts.username}@" if parts.username else ""
        path = "/" + (database if database is not None else parts.path.lstrip("/"))
        return urlunsplit((parts.scheme, f"{user}{host}:{port}", path, parts.query, parts.fragment))

    def every_node(self) -> list[tuple[str, int]]:
        coordinator = [(h, p) for h, p, g in self.nodes if g == 0]
        return coordinator + self.workers

    async def create_database(self, name: str, template: str | None = None) -> None:
        """``name`` on every node: a Citus database of its own with the workers registered, or a
        copy of ``template`` (a distributed database made so)."""
        for host, port in self.every_node():
            conn = await asyncpg.connect(self.node_url(host, port))
            try:
                await _create(conn, name, template)
            finally:
                await conn.close()
        if template is not None:
            return
        for host, port in self.every_node():
            conn = await asyncpg.connect(self.node_url(host, port, name))
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
            finally:
                await conn.close()
        conn = await asyncpg.connect(self.node_url(*self.every_node()[0], name))
        try:
            for host, port, group in self.nodes:
                if group == 0:
                    await conn.execute("SELECT citus_set_coordinator_host($1, $2)", host, port)
                else:
                    await conn.execute("SELECT citus_add_node($1, $2)", host, port)
        finally:
            await conn.close()


async def _create(conn: asyncpg.Connection, name: str, template: str | None) -> None:
    if template is None:
        await conn.execute(f'CREATE DATABASE "{name}"')
        return
    for attempt in range(50):
        # Citus's maintenance daemon (and cached connections from the coordinator) hold the template
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = $1 AND pid <> pg_backend_pid()", template)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            return
        except asyncpg.ObjectInUseError:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)


async def _cluster(url: str) -> Cluster | None:
    conn = await asyncpg.connect(url)
    try:
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"):
            return None
        rows = await conn.fetch("SELECT nodename, nodeport, groupid FROM pg_dist_node "
                                "WHERE noderole = 'primary' AND isactive ORDER BY groupid")
    finally:
        await conn.close()
    nodes = tuple((r["nodename"], r["nodeport"], r["groupid"]) for r in rows)
    if not any(group != 0 for _, _, group in nodes):
        return None
    if not any(group == 0 for _, _, group in nodes):  # the coordinator not registered: the URL's server
        parts = urlsplit(url)
        nodes = ((parts.hostname or "127.0.0.1", parts.port or 5432, 0), *nodes)
    return Cluster(url, nodes)


def cluster(url: str) -> Cluster | None:
    """The Citus cluster whose coordinator ``url`` is (its database has Citus and workers), or None."""
    return asyncio.run(_cluster(url))
