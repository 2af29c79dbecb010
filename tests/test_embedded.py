"""The embedded PostgreSQL as the proxy starts it: its processes are scheduled as batch work
unless ``[database] embedded_batch_scheduling`` is off (docs/scaling.md#the-embedded-database)."""

import logging
import os
import signal
import subprocess
import sys

import httpx
import pytest

from storage.embedded import child_pids, schedule_as_batch, start_embedded

from .conftest import make_settings, serve_proxy, wait_for, wait_ready
from .fakes import free_port
from .helpers import MODEL

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="scheduling policies are Linux's")


def postmaster(data_dir) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])


def policies(data_dir) -> dict[int, int]:
    """The scheduling policy of the postmaster and of each of its children (backends, writers)."""
    master = postmaster(data_dir)
    return {pid: os.sched_getscheduler(pid) for pid in (master, *child_pids(master))}


def stored_call(base: str, key: str, cid: str) -> None:
    r = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                   headers={"Authorization": f"Bearer {key}", "X-Conversation-Id": cid},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["x-node-id"]


def test_the_embedded_server_runs_as_batch_work_unless_configured_not_to(tmp_path, upstream_url, key, cid, caplog):
    data = tmp_path / "data"
    settings = make_settings("", upstream_url, database={"data_dir": str(data)})
    assert settings.database.embedded_batch_scheduling  # the default
    with caplog.at_level(logging.INFO), serve_proxy(settings) as proxy:
        stored_call(proxy.url, key, cid)
        # attaching to the running server (what `serve`'s app does after `serve` started it) is
        # not said as a start again
        start_embedded(data)
        assert [r.getMessage() for r in caplog.records].count("embedded PostgreSQL running") == 1
        seen = policies(data)
        # the postmaster, its writers, and the backends serving the proxy's connections, which
        # the postmaster started after its own policy was set
        assert len(seen) >= 3 and set(seen.values()) == {os.SCHED_BATCH}, seen

    # the same data directory, started again (the proxy stopped its server) with the setting off
    settings = make_settings("", upstream_url, database={"data_dir": str(data), "embedded_batch_scheduling": False})
    with serve_proxy(settings) as proxy:
        stored_call(proxy.url, key, cid)
        assert set(policies(data).values()) == {os.SCHED_OTHER}


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_serve_with_workers_starts_the_embedded_server_as_configured(tmp_path, upstream_url, key, cid):
    # several workers share one embedded server, started by `serve` itself before them
    data = tmp_path / "data"
    config = tmp_path / "bp.toml"
    for batch, policy in ((True, os.SCHED_BATCH), (False, os.SCHED_OTHER)):
        config.write_text(f"[database]\nembedded_batch_scheduling = {str(batch).lower()}\n")
        port = free_port()
        env = {**os.environ, "BRANCHPOINT_DATA_DIR": str(data), "BRANCHPOINT_UPSTREAM_URL": upstream_url,
               "BRANCHPOINT_CONFIG": str(config)}
        env.pop("BRANCHPOINT_DATABASE_URL", None)
        proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--workers", "2", "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            stored_call(f"http://127.0.0.1:{port}", key, cid)
            assert set(policies(data).values()) == {policy}
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


@pytest.mark.slow  # (processes of its own, each an embedded server's start: the slow CI step, .ci/slow.sh)
@pytest.mark.parametrize("died", ["before", "after"])
def test_a_process_killed_outright_does_not_keep_the_server_running_after_the_others_stop(tmp_path, died):
    # a `serve` SIGKILLed leaves the server running (nobody stopped it); another attached to it --
    # after the death, or before -- stops it when it stops: the dead process, still on the
    # library's list of those using it, kept it running for good
    data = tmp_path / "data"
    script = ("import os, sys; from storage.embedded import start_embedded; "
              "start_embedded(sys.argv[1]); os.kill(os.getpid(), 9)")
    survivor = start_embedded(data) if died == "after" else None
    dead = subprocess.run([sys.executable, "-c", script, str(data)], timeout=120)
    assert dead.returncode == -signal.SIGKILL
    master = postmaster(data)
    try:
        (survivor or start_embedded(data)).stop()
        wait_for(lambda: not data.joinpath("pgdata", "postmaster.pid").exists(), 20, "the server stopped")
    finally:
        try:
            os.kill(master, signal.SIGTERM)  # (still running when the test failed: stopped here)
        except ProcessLookupError:
            pass


def test_schedule_as_batch_reaches_children_and_leaves_a_chosen_policy_alone():
    # a parent with two children, one of which an operator moved to SCHED_IDLE
    script = ("import subprocess, sys, time; "
              "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(2)]; "
              "print(' '.join(str(k.pid) for k in kids), flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        kids = [int(p) for p in parent.stdout.readline().split()]
        assert sorted(child_pids(parent.pid)) == sorted(kids)
        os.sched_setscheduler(kids[1], os.SCHED_IDLE, os.sched_param(0))
        assert schedule_as_batch(parent.pid) == 2
        assert os.sched_getscheduler(parent.pid) == os.SCHED_BATCH
        assert os.sched_getscheduler(kids[0]) == os.SCHED_BATCH
        assert os.sched_getscheduler(kids[1]) == os.SCHED_IDLE
        assert schedule_as_batch(parent.pid) == 0  # once is enough
    finally:
        for pid in child_pids(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_a_server_not_ours_to_change_keeps_its_policy_and_says_so_once(monkeypatch, caplog):
    def refuse(pid, policy, param):
        raise PermissionError(1, "Operation not permitted")

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(os, "sched_setscheduler", refuse)
        with caplog.at_level("INFO", logger="branchpoint.storage"):
            assert schedule_as_batch(os.getpid()) == 0  # this test process and its child
        records = [r for r in caplog.records if "keeps its scheduling policy" in r.getMessage()]
        assert len(records) == 1 and len(records[0].processes) >= 2
        assert os.sched_getscheduler(child.pid) == os.SCHED_OTHER
    finally:
        child.kill()
        child.wait()


def test_the_embedded_database_is_backed_up_without_anything_installed(tmp_path, upstream_url, key, cid, pg_server_url):
    """`branchpoint backup` of the zero-setup database (its own pg_dump), restored elsewhere."""
    from click.testing import CliRunner

    from proxy.cli import main

    from .conftest import Db, new_database

    data = tmp_path / "data"
    settings = make_settings("", upstream_url, database={"url": "", "data_dir": str(data)})
    with serve_proxy(settings) as proxy:
        stored_call(proxy.url, key, cid)
    env = {"BRANCHPOINT_DATA_DIR": str(data), "BRANCHPOINT_CONFIG": "", "BRANCHPOINT_DATABASE_URL": ""}
    dump = tmp_path / "embedded.dump"
    result = CliRunner().invoke(main, ["backup", str(dump)], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    target = new_database(pg_server_url, "bp_from_embedded")
    result = CliRunner().invoke(main, ["restore", str(dump)], env={**env, "BRANCHPOINT_DATABASE_URL": target},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert Db(target).fetchval("SELECT count(*) FROM nodes WHERE conversation_id = $1", cid) == 1


@pytest.mark.slow  # (seconds of its own: the slow CI step, .ci/slow.sh)
def test_a_backup_of_the_embedded_database_while_it_serves_leaves_it_serving(tmp_path, upstream_url, key, cid):
    """The command attaches to the embedded server `serve` runs, and leaves it running."""
    from click.testing import CliRunner

    from proxy.cli import main

    data = tmp_path / "data"
    port = free_port()
    env = {**os.environ, "BRANCHPOINT_DATA_DIR": str(data), "BRANCHPOINT_UPSTREAM_URL": upstream_url,
           "BRANCHPOINT_CONFIG": ""}
    env.pop("BRANCHPOINT_DATABASE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        stored_call(base, key, cid)
        dump = tmp_path / "live.dump"
        cli_env = {"BRANCHPOINT_DATA_DIR": str(data), "BRANCHPOINT_CONFIG": "", "BRANCHPOINT_DATABASE_URL": ""}
        result = CliRunner().invoke(main, ["backup", str(dump)], env=cli_env, catch_exceptions=False)
        assert result.exit_code == 0 and dump.stat().st_size > 0, result.output
        listed = CliRunner().invoke(main, ["conversations", "list"], env=cli_env, catch_exceptions=False)
        assert cid in listed.output
        stored_call(base, key, cid)  # the proxy's database is still there
        assert httpx.get(f"{base}/readyz", timeout=5).status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
