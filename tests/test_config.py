"""Settings: defaults < file (key by key) < environment (docs/behaviour.md#configuration)."""

import hashlib

import pytest

from config import SettingsError, load_settings


def test_defaults():
    s = load_settings(env={})
    assert s.server.lease_seconds == 300
    assert s.auth.mode == "passthrough"
    assert s.upstreams[0].base_url == "https://api.openai.com/v1"
    assert s.compaction.soft == 0.7 and s.compaction.hard == 0.9 and s.compaction.keep_recent == 6
    assert s.limits_for("gpt-4o-mini").input_limit == 128000 - 16384


def test_file_overrides_key_by_key(tmp_path):
    f = tmp_path / "bp.toml"
    f.write_text("[server]\nlease_seconds = 42\n")
    s = load_settings(f, env={})
    assert s.server.lease_seconds == 42
    assert s.server.port == 8080  # every other default kept
    assert s.compaction.hard == 0.9
    assert s.upstreams[0].name == "openai"


def test_config_env_var_names_the_file_and_env_overrides_win(tmp_path):
    f = tmp_path / "bp.toml"
    f.write_text('[database]\nurl = "postgresql://file/db"\n[[upstreams]]\nname = "a"\nbase_url = "http://a/v1"\nmodels = ["*"]\n')
    s = load_settings(env={"BRANCHPOINT_CONFIG": str(f)})
    assert s.database.url == "postgresql://file/db"
    s = load_settings(env={
        "BRANCHPOINT_CONFIG": str(f),
        "BRANCHPOINT_DATABASE_URL": "postgresql://env/db",
        "BRANCHPOINT_UPSTREAM_URL": "http://127.0.0.1:9000/v1",
        "BRANCHPOINT_UPSTREAM_API_KEY": "sk-up",
        "BRANCHPOINT_DATA_DIR": "/tmp/bp",
    })
    assert s.database.url == "postgresql://env/db"
    assert s.database.data_dir == "/tmp/bp"
    assert s.upstreams[0].base_url == "http://127.0.0.1:9000/v1"
    assert s.upstreams[0].api_key == "sk-up"
    # set empty, each says what its empty value means: the embedded PostgreSQL, the client's key forwarded
    f.write_text('[database]\nurl = "postgresql://file/db"\n[[upstreams]]\nname = "a"\nbase_url = "http://a/v1"\n'
                 'models = ["*"]\napi_key = "sk-file"\n')
    s = load_settings(env={"BRANCHPOINT_CONFIG": str(f), "BRANCHPOINT_DATABASE_URL": "",
                           "BRANCHPOINT_UPSTREAM_API_KEY": ""})
    assert s.database.url == "" and s.upstreams[0].api_key in ("", None)


def test_model_routing_first_match_and_limits_most_specific(tmp_path):
    f = tmp_path / "bp.toml"
    f.write_text(
        '[[upstreams]]\nname = "anthropic"\nbase_url = "http://a/v1"\nmodels = ["claude-*"]\n'
        '[[upstreams]]\nname = "default"\nbase_url = "http://d/v1"\nmodels = ["*"]\n'
        '[models."tiny*"]\ncontext_window = 1000\nmax_output_tokens = 200\n'
        '[models."tiny-special"]\ncontext_window = 2000\nmax_output_tokens = 100\n'
    )
    s = load_settings(f, env={"BRANCHPOINT_UPSTREAM_URL": "http://override/v1"})
    assert s.upstream_for("claude-3-haiku").name == "anthropic"
    assert s.upstream_for("gpt-4o").name == "default"
    assert s.upstream_for("gpt-4o").base_url == "http://override/v1"  # env moves the catch-all only
    assert s.upstream_for("claude-3").base_url == "http://a/v1"
    assert s.limits_for("tiny-x").input_limit == 800
    assert s.limits_for("tiny-special").input_limit == 1900


@pytest.mark.parametrize("text", [
    "[compaction]\nsoft = 1.5\n",
    "[server]\nlease_seconds = 0\n",
    "[server]\nno_such_key = 1\n",
    "[auth]\nmode = \"keys\"\n",
    "not toml at all [",
    # values every comparison passes or that break only later (found by a probe)
    "[server]\nlease_seconds = nan\n",
    "[server]\nlease_seconds = 1e13\n",  # (past PostgreSQL's interval: every call was 500)
    "[server]\nclient_body_timeout = -1\n",
    "[retention]\nidle_days = 1e7\n",  # (a cutoff before year 1: every retention pass failed)
    "[compaction]\nsoft = inf\n",
    "[server]\nport = 70000\n",
    "[server]\nmax_connections = 0\n",  # (uvicorn would answer every request 503)
    '[models."x*"]\ncontext_window = 1000\nmax_output_tokens = 1000\n',
    '[models."x*"]\ncontext_window = -5\nmax_output_tokens = -10\n',
    "[server]\nlog_level = \"bogus\"\n",
    "[database]\npool_min = 10\npool_max = 2\n",
    "[database]\npool_max = 0\n",
    "[database]\ncommand_timeout = 0\n",
    "[database]\nurl = \"notaurl\"\n",
    "[upstream_defaults]\nread_timeout = -1\n",
    "[upstream_defaults]\nca_bundle = \"/nonexistent.pem\"\n",
    "[[upstreams]]\nname = \"x\"\nbase_url = \"not a url\"\n",
    "[[upstreams]]\nname = \"x\"\nbase_url = \"ftp://127.0.0.1/v1\"\n",
    "[[upstreams]]\nname = \"x\"\nbase_url = \"http://127.0.0.1/v1?api-version=1\"\n",  # (paths went after the query)
    "[auth]\nmode = \"keys\"\n[[auth.keys]]\nkey = \" sk-spaced-0123456789 \"\ntenant = \"t\"\n",  # (never matched)
    "[auth]\nmode = \"keys\"\n[[auth.keys]]\nkey = \"sha256:zz\"\ntenant = \"t\"\n",
    "[auth]\nmode = \"keys\"\n[[auth.keys]]\nkey = \"k1\"\ntenant = \"t1\"\n[[auth.keys]]\nkey = \"k1\"\ntenant = \"t2\"\nadmin = true\n",
])
def test_invalid_config_is_refused(tmp_path, text):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(SettingsError):
        load_settings(f, env={})


@pytest.mark.parametrize(("entry", "said"), [
    ('context_window = "200k"\nmax_output_tokens = 8192\n', 'Expected `int`, got `str` - at `$.models."my-*".context_window`'),
    ("context_window = 1000\nmax_output_token = 10\n", 'unknown field `max_output_token` - at `$.models."my-*"`'),
    ("context_window = 1000\n", 'missing required field `max_output_tokens` - at `$.models."my-*"`'),
])
def test_a_bad_models_entry_is_named_by_its_glob(tmp_path, entry, said):
    """msgspec names any key of a table ``[...]``: with several ``[models]`` entries (the defaults
    hold some) the error did not say which one was wrong."""
    f = tmp_path / "bad.toml"
    f.write_text(f'[models."ok-*"]\ncontext_window = 1000\nmax_output_tokens = 10\n[models."my-*"]\n{entry}')
    with pytest.raises(SettingsError) as caught:
        load_settings(f, env={})
    assert said in str(caught.value), str(caught.value)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(SettingsError):
        load_settings(tmp_path / "nope.toml", env={})


def test_what_logging_and_libpq_take_is_taken(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text('[server]\nlog_level = "warn"\n[database]\nurl = "postgresql://"\n')
    assert load_settings(f, env={}).server.log_level == "warn"
    f.write_text('[[upstreams]]\nname = "x"\nbase_url = "http://[bad/v1"\n')
    with pytest.raises(SettingsError):
        load_settings(f, env={})
    f.write_text('[auth]\nmode = "keys"\n[[auth.keys]]\nkey = "k1"\ntenant = "t1"\n[[auth.keys]]\n'
                 f'key = "sha256:{hashlib.sha256(b"k1").hexdigest().upper()}"\ntenant = "t2"\n')
    with pytest.raises(SettingsError):  # (the same key, once in clear and once hashed)
        load_settings(f, env={})


def test_an_invalid_upstream_url_from_the_environment_is_refused():
    with pytest.raises(SettingsError):
        load_settings(None, env={"BRANCHPOINT_UPSTREAM_URL": "notaurl"})
    assert load_settings(None, env={"BRANCHPOINT_DATABASE_URL": "postgresql:///bp?host=/run/postgresql"}).database.url


@pytest.mark.parametrize("url", ["postgresql://u:p@127.0.0.1:99999/x", "postgresql://u:p@127.0.0.1:abc/x",
                                 "postgresql://h1:5432,h2:70000/x", "postgresql://h:0/x",
                                 "postgresql://admin:hunter2#x@db.example/bp", "postgresql://admin:hunter2?x@db/bp"])
def test_a_database_url_whose_port_is_none_is_refused_saying_so(url):
    """(asyncpg raised OverflowError or ValueError for these at the first connection: a traceback
    from every command). A password with an unencoded '#' or '?' ends the address early, and
    reads as the port: it is never said."""
    with pytest.raises(SettingsError, match="port") as refused:
        load_settings(None, env={"BRANCHPOINT_DATABASE_URL": url})
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("url", ["postgresql://u:p@127.0.0.1:5432/x", "postgresql://h1:5432,h2:5433/x",
                                 "postgresql://u:p@[::1]:6432/x", "postgresql://h1,h2/x", "postgresql:///x?host=/tmp",
                                 "postgresql://h:%35432/x", "postgresql://u:p@[fe80::1%25eth0]:5432/x",
                                 "postgresql://u:p@%2Ftmp/x", "postgresql://h:/x"])
def test_database_urls_libpq_takes_are_taken(url):
    assert load_settings(None, env={"BRANCHPOINT_DATABASE_URL": url}).database.url == url


def test_an_upstream_url_whose_port_is_none_is_refused():
    with pytest.raises(SettingsError, match="base_url"):
        load_settings(None, env={"BRANCHPOINT_UPSTREAM_URL": "http://127.0.0.1:99999/v1"})


def test_serve_refuses_a_port_out_of_range():
    from click.testing import CliRunner

    from proxy.cli import main

    result = CliRunner().invoke(main, ["serve", "--port", "70000"])
    assert result.exit_code == 2 and "70000" in result.output
