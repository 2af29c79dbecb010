"""The ``branchpoint`` command against a real database holding conversations made through the API."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import asyncpg
import httpx
import pytest
from click.testing import CliRunner

from proxy.cli import main

from .conftest import Db, make_settings, new_database, run, serve_proxy
from .fakes import Reply, free_port
from .helpers import MODEL, user


@pytest.fixture
def populated(fresh_database_url, upstream_url, upstream):
    """A database with a branched conversation, a second tenant's conversation and a fork."""
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client = p.openai("sk-cli-owner")
        h = lambda raw: raw.headers  # noqa: E731
        first = h(client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[user("What were sales last month?")], extra_headers={"X-Conversation-Id": "sales"}))
        client.chat.completions.create(model=MODEL, messages=[user("And by region?")], extra_headers={"X-Conversation-Id": "sales"})
        client.chat.completions.create(model=MODEL, messages=[user("By country instead?")],
                                       extra_headers={"X-Conversation-Id": "sales", "X-Parent-Node-Id": first["x-node-id"]})
        upstream.enqueue(Reply(kind="error", status=500))
        try:
            client.chat.completions.create(model=MODEL, messages=[user("and this one fails")], extra_headers={"X-Conversation-Id": "sales"})
        except Exception:
            pass
        p.openai("sk-cli-other").chat.completions.create(model=MODEL, messages=[user("other tenant")],
                                                         extra_headers={"X-Conversation-Id": "sales"})
        p.http("sk-cli-owner").post("/admin/conversations/sales/fork", json={"conversation_id": "sales-copy"})
    return fresh_database_url, first["x-node-id"]


def cli(database_url, *args):
    env = {"BRANCHPOINT_DATABASE_URL": database_url, "BRANCHPOINT_CONFIG": ""}
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result


def test_conversations_list(populated):
    url, _ = populated
    result = cli(url, "conversations", "list")
    assert result.exit_code == 0, result.output
    assert result.output.count("sales") >= 3 and "sales-copy" in result.output
    assert "3 conversation(s)" in result.output  # sales of two tenants, and the fork sales-copy
    assert "tokens" in result.output
    tokens = Db(url).fetchval("SELECT sum((usage->>'prompt_tokens')::int + (usage->>'completion_tokens')::int)"
                              " FROM nodes WHERE conversation_id = 'sales' AND usage IS NOT NULL"
                              " AND tenant = (SELECT tenant FROM conversations WHERE id = 'sales-copy')")
    assert f" {tokens:,} " in result.output  # the owner's sales conversation's sum


def test_conversations_show_draws_the_tree(populated):
    url, first = populated
    result = cli(url, "conversations", "show", "sales")
    assert result.exit_code != 0 and "several tenants" in result.output  # the id exists for two tenants
    db = Db(url)
    tenant = db.fetchval("SELECT tenant FROM nodes WHERE id = $1", __import__("uuid").UUID(first))
    result = cli(url, "conversations", "show", "sales", "--tenant", tenant)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "◀ head" in out and out.count("◀ head") == 1
    assert first[-8:] in out
    assert "echo: What were sales last month?" in out and "echo: By country instead?" in out
    assert "failed" in out and "success" in out and MODEL in out and "tok" in out
    # two branches under the first node: the tree is drawn with branch glyphs
    assert "├──" in out and "└──" in out
    head = db.head("sales-copy")
    result = cli(url, "conversations", "show", "sales-copy")
    assert result.exit_code == 0 and head[-8:] in result.output


def test_conversations_export(populated, tmp_path):
    url, first = populated
    db = Db(url)
    tenant = db.fetchval("SELECT tenant FROM nodes WHERE id = $1", __import__("uuid").UUID(first))
    out = tmp_path / "sales.jsonl"
    result = cli(url, "conversations", "export", "sales", "--tenant", tenant, "-o", str(out))
    assert result.exit_code == 0, result.output
    nodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(nodes) == 4
    ids = {n["id"] for n in nodes}
    assert all(n["parent_id"] is None or n["parent_id"] in ids for n in nodes)  # a closed tree
    assert sum(n["head"] for n in nodes) == 1
    assert nodes[0]["sent"] == [user("What were sales last month?")] and nodes[0]["received"][0]["content"]
    assert {n["status"] for n in nodes} == {"success", "failed"}
    assert set(nodes[0]) >= {"id", "parent_id", "kind", "status", "sent", "received", "model", "usage", "created_at"}
    # to standard output too
    result = cli(url, "conversations", "export", "sales", "--tenant", tenant)
    assert len(result.output.strip().splitlines()) == 4


def test_a_failed_export_leaves_no_file_and_says_why(populated, tmp_path):
    """An export of an unknown id writes nothing: a mistyped id left an empty file a backup script
    would take for an empty conversation (and emptied a file there before). A directory that does
    not exist is a message, not a traceback. The output is written where it points, as a shell's
    redirection would: through a link, keeping the file's mode."""
    url, _ = populated
    typo = tmp_path / "typo.jsonl"
    result = cli(url, "conversations", "export", "sales-typo", "-o", str(typo))
    assert result.exit_code == 1 and "no conversation" in result.output
    assert not typo.exists() and list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept.jsonl"
    kept.write_text("before\n")
    kept.chmod(0o644)
    result = cli(url, "conversations", "export", "sales-typo", "-o", str(kept))
    assert result.exit_code == 1 and kept.read_text() == "before\n" and list(tmp_path.iterdir()) == [kept]
    missing = tmp_path / "no-such-dir" / "x.jsonl"
    result = cli(url, "conversations", "export", "sales-copy", "-o", str(missing))
    assert result.exit_code == 1 and result.output.startswith("Error: cannot write ") and str(missing) in result.output
    assert "Traceback" not in result.output
    link = tmp_path / "link.jsonl"
    link.symlink_to(kept)
    result = cli(url, "conversations", "export", "sales-copy", "-o", str(link))
    assert result.exit_code == 0 and link.is_symlink() and kept.read_text() != "before\n"
    assert kept.stat().st_mode & 0o777 == 0o644


def test_the_admin_api_exports_what_the_command_exports(populated, upstream_url):
    """GET /admin/conversations/{id}/export: the same JSON Lines as the command (so the command
    imports it), for the conversation's own tenant only; read a page at a time."""
    url, first = populated
    tenant = Db(url).fetchval("SELECT tenant FROM nodes WHERE id = $1", __import__("uuid").UUID(first))
    expected = [json.loads(line) for line in cli(url, "conversations", "export", "sales", "--tenant", tenant).output.splitlines()]
    with serve_proxy(make_settings(url, upstream_url)) as p:
        r = p.http("sk-cli-owner").get("/admin/conversations/sales/export")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/jsonl")
        assert r.headers["content-disposition"] == 'attachment; filename="sales.jsonl"'
        assert [json.loads(line) for line in r.text.splitlines()] == expected
        other = p.http("sk-cli-other").get("/admin/conversations/sales-copy/export")
        assert other.status_code == 404 and other.json()["error"]["code"] == "conversation_not_found"

    async def pages(batch: int) -> list[str]:
        from storage import AdminStore, open_database

        db = await open_database(url, min_size=1, max_size=2)
        try:
            store = AdminStore(db)
            conv = await store.conversation(tenant, "sales-copy")  # a fork: its source's nodes come too
            return [str(row.id) async for row in store.export(conv, batch=batch)]
        finally:
            await db.close()

    whole = run(pages(500))
    assert len(whole) == 3 and run(pages(1)) == whole == run(pages(2))


def test_backup_and_restore_into_an_empty_database(populated, pg_server_url, upstream_url, upstream, tmp_path):
    url, _ = populated
    dump = tmp_path / "branchpoint.dump"
    result = cli(url, "backup", str(dump))
    assert result.exit_code == 0 and "backed up to" in result.output, result.output
    target = new_database(pg_server_url, "bp_restored")  # empty: no schema at all
    result = cli(target, "restore", str(dump))
    assert result.exit_code == 0 and "restored" in result.output, result.output
    query = "SELECT tenant, id, head_node_id FROM conversations ORDER BY tenant, id"
    assert Db(target).fetch(query) == Db(url).fetch(query)
    nodes = "SELECT id, parent_id, sent, received, outcome, chain FROM nodes ORDER BY id"
    assert Db(target).fetch(nodes) == Db(url).fetch(nodes)
    assert cli(target, "check").exit_code == 0
    # the proxy runs on it, and the next turn has the same context as on the original
    with serve_proxy(make_settings(url, upstream_url)) as p:
        p.openai("sk-cli-owner").chat.completions.create(model=MODEL, messages=[user("next")],
                                                        extra_headers={"X-Conversation-Id": "sales"})
        original = upstream.last.messages
    with serve_proxy(make_settings(target, upstream_url)) as p:
        p.openai("sk-cli-owner").chat.completions.create(model=MODEL, messages=[user("next")],
                                                        extra_headers={"X-Conversation-Id": "sales"})
        assert upstream.last.messages == original


def test_a_restore_never_replaces_what_it_must_not(populated, pg_server_url, tmp_path):
    url, _ = populated
    dump = tmp_path / "branchpoint.dump"
    assert cli(url, "backup", str(dump)).exit_code == 0
    target = new_database(pg_server_url, "bp_restored")
    assert cli(target, "restore", str(dump)).exit_code == 0
    held = cli(target, "restore", str(dump))  # it holds conversations now
    assert held.exit_code == 1 and "--replace" in held.output
    Db(target).fetch("DELETE FROM conversations WHERE id = 'sales-copy'")

    async def with_another_session() -> tuple[int, str]:
        conn = await __import__("asyncpg").connect(target)
        try:
            result = await asyncio.to_thread(cli, target, "restore", "--replace", str(dump))
            return result.exit_code, result.output
        finally:
            await conn.close()

    code, output = run(with_another_session())  # a proxy still serving, say
    assert code == 1 and "stop the proxy" in output
    assert Db(target).fetchval("SELECT count(*) FROM conversations WHERE id = 'sales-copy'") == 0  # (nothing done)

    async def with_a_session_ending() -> tuple[int, str]:
        """A session that ends a moment after the restore began (a proxy just stopped; the last
        command's own connections, whose server processes end after their clients have gone):
        given time to go, not counted -- the restore refused at random, on a loaded machine."""
        conn = await __import__("asyncpg").connect(target)
        restoring = asyncio.ensure_future(asyncio.to_thread(cli, target, "restore", "--replace", str(dump)))
        await asyncio.sleep(0.5)
        await conn.close()
        result = await restoring
        return result.exit_code, result.output

    code, output = run(with_a_session_ending())
    assert code == 0, output
    Db(target).fetch("DELETE FROM conversations WHERE id = 'sales-copy'")
    assert Db(target).fetchval("SELECT count(*) FROM conversations WHERE id = 'sales-copy'") == 0
    assert cli(target, "restore", "--replace", str(dump)).exit_code == 0
    assert Db(target).fetchval("SELECT count(*) FROM conversations WHERE id = 'sales-copy'") == 1  # replaced
    broken = tmp_path / "broken.dump"
    broken.write_bytes(b"not a backup")
    result = cli(target, "restore", "--replace", str(broken))
    assert result.exit_code == 1 and "pg_restore failed" in result.output
    assert Db(target).fetchval("SELECT count(*) FROM conversations") == 3  # nothing lost


def test_usage_by_tenant_and_model(populated):
    url, _ = populated
    db = Db(url)
    expected = {(r["tenant"][:16], r["calls"], r["tokens"]) for r in db.fetch(
        "SELECT n.tenant, count(*) AS calls, sum(coalesce((n.usage->>'prompt_tokens')::int, 0)"
        " + coalesce((n.usage->>'completion_tokens')::int, 0)) AS tokens"
        " FROM nodes n JOIN conversations c ON c.tenant = n.tenant AND c.id = n.conversation_id GROUP BY n.tenant")}
    result = cli(url, "usage")
    assert result.exit_code == 0, result.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines() if "│" in line]
    shown = {(c[0], int(c[2].replace(",", "")), int(c[6].replace(",", ""))) for c in cells  # (tenant, calls, total)
             if c[0] in {t for t, _, _ in expected}}
    assert "cached" in result.output
    assert shown == expected and len(expected) == 2  # the two tenants, each apart
    assert "gpt-4o-mini" in result.output
    tenant = next(iter(expected))[0]
    assert cli(url, "usage", "--since", "2000-01-01", "--until", "2000-02-01").output.count(tenant) == 0
    assert cli(url, "usage", "--since", "2030-01-01", "--until", "2029-01-01").exit_code == 2


def test_the_commands_read_the_statement_timeout_of_the_configuration(populated, tmp_path):
    url, _ = populated
    config = tmp_path / "short.toml"
    config.write_text("[database]\ncommand_timeout = 0.000001\n")
    env = {"BRANCHPOINT_DATABASE_URL": url, "BRANCHPOINT_CONFIG": str(config)}
    result = CliRunner().invoke(main, ["usage"], env=env)
    assert result.exit_code == 1 and "the database failed" in result.output, (result.output, result.exception)
    assert cli(url, "usage").exit_code == 0  # the default allows it


def test_check_reports_ok_then_a_violation(populated):
    url, _ = populated
    result = cli(url, "check")
    assert result.exit_code == 0 and "every invariant holds" in result.output
    Db(url).fetch("UPDATE nodes SET received = NULL WHERE status = 'success' AND kind = 'turn' AND id = "
                  "(SELECT id FROM nodes WHERE status = 'success' LIMIT 1)")
    result = cli(url, "check")
    assert result.exit_code == 1 and "success_has_received" in result.output


def test_migrate(fresh_database_url, pg_server_url):
    result = cli(fresh_database_url, "migrate")
    assert result.exit_code == 0 and "schema is current" in result.output
    result = cli(new_database(pg_server_url), "migrate")
    from storage import latest_version

    assert result.exit_code == 0 and f"applied {latest_version()} migration(s)" in result.output


def test_a_command_on_a_database_not_migrated_says_to_migrate_it(pg_server_url):
    """A command that reads the schema, on a database without it (a new one) or with an older
    version of it: one line saying what to run -- it was PostgreSQL's 'relation "conversations"
    does not exist'."""
    empty = new_database(pg_server_url)
    for args in (["conversations", "list"], ["usage"], ["check"]):
        result = cli(empty, *args)
        assert result.exit_code == 1, (args, result.output)
        assert "holds no Branchpoint schema: run `branchpoint migrate` first" in result.output, (args, result.output)

    async def older() -> None:  # the newest migration undone in the record only: the schema reads as one version older
        conn = await asyncpg.connect(empty)
        try:
            await conn.execute("DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)")
        finally:
            await conn.close()

    assert cli(empty, "migrate").exit_code == 0
    assert cli(empty, "conversations", "list").exit_code == 0
    run(older())
    from storage import latest_version

    result = cli(empty, "conversations", "list")
    assert result.exit_code == 1
    assert (f"the database schema is at version {latest_version() - 1}, this Branchpoint needs {latest_version()}: "
            "run `branchpoint migrate` first") in result.output


def test_migrate_waits_for_a_migration_running_elsewhere(fresh_database_url, tmp_path):
    """A migration holding its lock elsewhere (a server starting, rebuilding an index) longer than
    [database] command_timeout: the command waits for it, as a starting server does -- it ran on
    a connection of the request pool, and failed "database unavailable" once the timeout passed."""
    import threading

    from storage.migrate import _LOCK_KEY

    config = tmp_path / "short.toml"
    config.write_text("[database]\ncommand_timeout = 1\n")
    holding, release = threading.Event(), threading.Event()

    async def hold() -> None:
        conn = await asyncpg.connect(fresh_database_url)
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
            holding.set()
            await asyncio.to_thread(release.wait, 30)
        finally:
            await conn.close()

    holder = threading.Thread(target=lambda: asyncio.run(hold()))
    holder.start()
    try:
        assert holding.wait(10)
        threading.Timer(3.0, release.set).start()  # (three command timeouts)
        result = CliRunner().invoke(main, ["migrate", "--config", str(config)], catch_exceptions=False,
                                    env={"BRANCHPOINT_DATABASE_URL": fresh_database_url, "BRANCHPOINT_CONFIG": ""})
    finally:
        release.set()
        holder.join()
    assert result.exit_code == 0 and "schema is current" in result.output, result.output


def test_serve_with_workers_fails_when_they_cannot_start(fresh_database_url):
    """A worker that cannot start (here: the database's schema is newer than this code) stops
    `serve --workers 2` with uvicorn's start-up failure, as one process does -- it exited 0, which
    a supervisor reads as a clean stop."""
    Db(fresh_database_url).fetch("INSERT INTO schema_migrations (version, name) VALUES (9999, 'from_the_future')")
    env = {**os.environ, "BRANCHPOINT_DATABASE_URL": fresh_database_url, "BRANCHPOINT_CONFIG": ""}
    for workers in ("1", "2"):
        done = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--workers", workers, "--port",
                               str(free_port())], env=env, capture_output=True, timeout=120)
        assert done.returncode == 3, (workers, done.returncode, done.stderr.decode()[-500:])
        assert "newer than this code" in done.stderr.decode()


def test_serve_says_in_one_line_that_it_cannot_reach_the_database():
    """A configured database that cannot be reached is found before the server (or any worker)
    starts, and said in one line naming where it was looked for, never the password; the exit is
    uvicorn's start-up failure (3) -- found by the app's start-up it was a forty-line traceback."""
    env = {**os.environ, "BRANCHPOINT_DATABASE_URL": "postgresql://u:p@127.0.0.1:1/x", "BRANCHPOINT_CONFIG": ""}
    for workers in ("1", "2"):
        done = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--workers", workers, "--port",
                               str(free_port())], env=env, capture_output=True, timeout=120)
        assert done.returncode == 3, (workers, done.returncode, done.stderr.decode()[-500:])
        err = done.stderr.decode()
        assert "Error: cannot reach the database at 127.0.0.1:1: " in err and "Traceback" not in err, err[-2000:]
        assert "u:p@" not in err and len(err.strip().splitlines()) == 1, err[-2000:]


def test_an_embedded_database_that_cannot_start_is_said_in_one_line(tmp_path):
    """The embedded PostgreSQL's data folder unusable -- a file, a folder holding something else,
    a server's data not the proxy's to read: each command says why in one line (the error of
    initdb or pg_ctl, or the system's), `serve` exits 3 as for a database it cannot reach -- they
    were tracebacks, and `serve` logged the server's whole log as one line."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    (tmp_path / "junk" / "pgdata").mkdir(parents=True)
    (tmp_path / "junk" / "pgdata" / "notes.txt").write_text("not a database")
    for data, why in ((a_file, f"not a folder: {a_file}"), (tmp_path / "junk", "exists but is not empty")):
        env = {**os.environ, "BRANCHPOINT_DATA_DIR": str(data), "BRANCHPOINT_CONFIG": ""}
        env.pop("BRANCHPOINT_DATABASE_URL", None)
        for command, code in ((["check"], 1), (["serve", "--port", str(free_port())], 3),
                              (["serve", "--workers", "2", "--port", str(free_port())], 3)):
            done = subprocess.run([sys.executable, "-m", "proxy.cli", *command], env=env, capture_output=True,
                                  timeout=120)
            err = done.stderr.decode()
            assert done.returncode == code, (command, done.returncode, err[-1000:])
            assert why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (command, err[-2000:])


def test_a_sigterm_while_serve_starts_leaves_no_embedded_server_running(tmp_path):
    """serve starts the embedded PostgreSQL before the app, before uvicorn takes the signals over:
    a SIGTERM then (a supervisor giving up on a slow start) ends the start-up through the code that
    stops the server -- its default action killed the process and left the server running."""
    env = {**os.environ, "BRANCHPOINT_DATA_DIR": str(tmp_path), "BRANCHPOINT_CONFIG": ""}
    env.pop("BRANCHPOINT_DATABASE_URL", None)
    serve = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(free_port())], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in serve.stdout:  # (the server is up: what follows is the app's start)
            if b"embedded PostgreSQL running" in line:
                break
        master = int((tmp_path / "pgdata" / "postmaster.pid").read_text().split()[0])
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) in (143, -signal.SIGTERM)  # (ours, or uvicorn's if it had taken over)
    finally:
        serve.kill()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{master}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{master}")


def test_a_url_setting_the_driver_refuses_is_named():
    """(said as "database unavailable: ClientConfigurationError", nothing to go on)"""
    result = CliRunner().invoke(main, ["check"], env={
        "BRANCHPOINT_DATABASE_URL": "postgresql://u:secretpw@127.0.0.1:1/x?sslmode=bogus", "BRANCHPOINT_CONFIG": ""})
    assert result.exit_code == 1 and "`sslmode` parameter must be one of" in result.output
    assert "secretpw" not in result.output


def test_arguments_that_are_no_number_or_place_are_refused_before_the_database(tmp_path):
    """(--grace nan took every pending node as stuck, or none; a backup into a missing folder was
    said as "the database failed")"""
    env = {"BRANCHPOINT_DATABASE_URL": "postgresql://u:p@127.0.0.1:1/x", "BRANCHPOINT_CONFIG": ""}
    for args, said in ((["check", "--grace", "nan"], "nan is not a number"), (["check", "--grace", "inf"], "--grace"),
                       (["backup", str(tmp_path / "missing" / "f.dump")], "no folder")):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 2 and said in result.output, (args, result.output)


def test_invalid_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nlease_seconds = -1\n")
    result = CliRunner().invoke(main, ["check", "--config", str(bad)])
    assert result.exit_code != 0 and "lease_seconds" in result.output


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_serve_with_several_workers_sharing_the_database(fresh_database_url, upstream_url, upstream, tmp_path):
    port = free_port()
    env = {**os.environ, "BRANCHPOINT_DATABASE_URL": fresh_database_url, "BRANCHPOINT_UPSTREAM_URL": upstream_url,
           "BRANCHPOINT_CONFIG": ""}
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--workers", "2", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        pids = set()
        while time.monotonic() < deadline and len(pids) < 2:
            try:
                with httpx.Client(base_url=base, timeout=2) as http:  # a new connection each time
                    pids.add(http.get("/healthz").json()["pid"])
            except httpx.HTTPError:
                time.sleep(0.2)
        assert len(pids) == 2, pids  # both workers answer
        import concurrent.futures

        def turns(i):
            with httpx.Client(base_url=base, timeout=20, headers={"Authorization": "Bearer sk-workers"}) as http:
                for k in range(3):
                    r = http.post("/v1/chat/completions", headers={"X-Conversation-Id": f"w{i}"},
                                  json={"model": MODEL, "messages": [user(f"turn {k}")]})
                    assert r.status_code == 200, r.text
            return i

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert sorted(pool.map(turns, range(8))) == list(range(8))
        db = Db(fresh_database_url)
        assert db.fetchval("SELECT count(*) FROM nodes WHERE status = 'success'") == 24
        for i in range(8):  # each conversation a clean line of three turns
            assert db.fetchval("SELECT max(depth) FROM nodes WHERE conversation_id = $1", f"w{i}") == 2
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_export_then_import_restores_the_tree(populated, tmp_path, upstream_url, upstream):
    url, first = populated
    out = tmp_path / "sales.jsonl"
    db = Db(url)
    tenant = db.fetchval("SELECT tenant FROM nodes WHERE id = $1", __import__("uuid").UUID(first))
    assert cli(url, "conversations", "export", "sales", "--tenant", tenant, "-o", str(out)).exit_code == 0
    result = cli(url, "conversations", "import", str(out), "--as", "sales-restored", "--key", "sk-cli-owner")
    assert result.exit_code == 0 and "imported 4 node(s)" in result.output, result.output
    again = cli(url, "conversations", "import", str(out), "--as", "sales-restored", "--key", "sk-cli-owner")
    assert again.exit_code != 0 and "already exists" in again.output
    with serve_proxy(make_settings(url, upstream_url)) as p:
        http = p.http("sk-cli-owner")
        original = http.get("/admin/conversations/sales/path").json()["data"]
        restored = http.get("/admin/conversations/sales-restored/path").json()["data"]
        assert [(n["kind"], n["status"], n["sent"], n["received"]) for n in restored] == \
               [(n["kind"], n["status"], n["sent"], n["received"]) for n in original]
        assert {n["id"] for n in restored}.isdisjoint({n["id"] for n in original})  # new ids, same shape
        assert http.get("/admin/conversations/sales-restored").json()["node_count"] == 4
        # the next turn in the restored conversation sees exactly the original context
        client = p.openai("sk-cli-owner")
        client.chat.completions.create(model=MODEL, messages=[user("next")], extra_headers={"X-Conversation-Id": "sales"})
        from_original = upstream.last.messages
        client.chat.completions.create(model=MODEL, messages=[user("next")], extra_headers={"X-Conversation-Id": "sales-restored"})
        assert upstream.last.messages == from_original


def test_import_with_a_key_gives_the_conversation_to_that_keys_tenant(populated, tmp_path, upstream_url):
    """--key is read as the configured auth mode reads it: in keys mode the tenant [[auth.keys]]
    names (the conversation was given to the key's hash, which no key of that mode reaches), in
    none mode the local tenant; a key the configuration does not know is refused."""
    url, first = populated
    out = tmp_path / "sales.jsonl"
    tenant = Db(url).fetchval("SELECT tenant FROM nodes WHERE id = $1", __import__("uuid").UUID(first))
    assert cli(url, "conversations", "export", "sales", "--tenant", tenant, "-o", str(out)).exit_code == 0
    keys = tmp_path / "keys.toml"
    keys.write_text('[auth]\nmode = "keys"\n[[auth.keys]]\nkey = "sk-team-a-0123456789"\ntenant = "team-a"\n')
    local = tmp_path / "none.toml"
    local.write_text('[auth]\nmode = "none"\n')
    env = {"BRANCHPOINT_DATABASE_URL": url, "BRANCHPOINT_CONFIG": ""}

    def imported(config, key, as_):
        return CliRunner().invoke(main, ["conversations", "import", str(out), "--as", as_, "--key", key,
                                         "--config", str(config)], env=env)

    assert imported(keys, "sk-team-a-0123456789", "for-team-a").exit_code == 0
    assert imported(local, "anything", "for-local").exit_code == 0
    refused = imported(keys, "sk-stranger-0123456789", "for-nobody")
    assert refused.exit_code != 0 and "invalid API key" in refused.output
    empty = CliRunner().invoke(main, ["conversations", "import", str(out), "--as", "for-no-one", "--tenant", " "],
                               env=env)  # (a tenant no key has: nobody could reach it)
    assert empty.exit_code != 0 and "--tenant is empty" in empty.output
    owners = dict(Db(url).fetch("SELECT id, tenant FROM conversations WHERE id LIKE 'for-%'"))
    assert owners == {"for-team-a": "team-a", "for-local": "local"}
    with serve_proxy(make_settings(url, upstream_url, auth={"mode": "keys", "keys": [
            {"key": "sk-team-a-0123456789", "tenant": "team-a"}]})) as p:
        assert p.http("sk-team-a-0123456789").get("/admin/conversations/for-team-a").status_code == 200


def test_export_and_import_keep_responses_nodes_and_their_matching(fresh_database_url, upstream_url, upstream, tmp_path):
    key = "sk-cli-responses"
    with serve_proxy(make_settings(fresh_database_url, upstream_url)) as p:
        client = p.openai(key, conversation="mixed")
        first = client.responses.create(model=MODEL, input="a Responses question", instructions="Be brief.")
        client.chat.completions.create(model=MODEL, messages=[user("a chat question")])
        tenant = Db(fresh_database_url).fetchval("SELECT tenant FROM conversations WHERE id = 'mixed'")
        out = tmp_path / "mixed.jsonl"
        assert cli(fresh_database_url, "conversations", "export", "mixed", "--tenant", tenant, "-o", str(out)).exit_code == 0
        assert [json.loads(line)["api"] for line in out.read_text().splitlines()] == ["responses", "chat"]
        shown = cli(fresh_database_url, "conversations", "show", "mixed", "--tenant", tenant)
        assert shown.exit_code == 0 and "echo: a Responses question" in shown.output  # its output item previewed
        result = cli(fresh_database_url, "conversations", "import", str(out), "--as", "mixed-copy", "--key", key)
        assert result.exit_code == 0, result.output
        # the copy is matched by content like the original: its transcript keys were computed
        history = [{"role": "system", "content": "Be brief."}, user("a Responses question"),
                   {"role": "assistant", "content": first.output_text}, user("a chat question"),
                   {"role": "assistant", "content": "echo: a chat question"}, user("next")]
        raw = p.openai(key, conversation="mixed-copy").chat.completions.with_raw_response.create(
            model=MODEL, messages=history, extra_headers={"X-Context-Mode": "full"})
        assert raw.headers["x-context-matched"] == "4"
        assert [m["content"] for m in upstream.last.messages] == [m["content"] for m in history]


def test_serve_tunes_the_garbage_collector(monkeypatch, fresh_database_url):
    """A serving process keeps what exists once the app is built out of later collections and
    collects its youngest generation less often (docs/architecture.md#the-garbage-collector)."""
    import gc

    import uvicorn

    import proxy.logs

    seen = {}

    def run_server(self):  # instead of serving: look at the collector as the server would start
        seen["threshold"], seen["frozen"] = gc.get_threshold(), gc.get_freeze_count()

    monkeypatch.setattr(uvicorn.Server, "run", run_server)
    monkeypatch.setattr(proxy.logs, "configure_logging", lambda *a, **k: None)  # keep the test's logging
    before = gc.get_threshold()
    try:
        result = CliRunner().invoke(main, ["serve", "--port", str(free_port())],
                                    env={"BRANCHPOINT_DATABASE_URL": fresh_database_url, "BRANCHPOINT_CONFIG": ""})
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    assert result.exit_code == 0, result.output
    assert seen["threshold"] == (10_000, 10, 10) and seen["frozen"] > 1000
