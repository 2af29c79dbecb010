"""Settings: built-in TOML defaults, overridden key by key by a file, then by the environment.

    defaults.toml  <  --config FILE / BRANCHPOINT_CONFIG  <  BRANCHPOINT_* environment variables

Nothing here is cached at import: ``load_settings()`` builds a fresh, immutable ``Settings`` each
time, and the app factory takes it as an argument (tests build their own).

Every default lives in ``defaults.toml``, once: the section structs below have no defaults of
their own, so a key missing there is an error, not a silent second value. Only the entries of
arrays a user writes -- ``[[upstreams]]`` and ``[[auth.keys]]`` -- default their optional fields
in the struct, since no file entry exists to merge them with.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import math
import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import msgspec

__all__ = [
    "MOST_SECONDS",
    "AuthKey",
    "AuthSettings",
    "CompactionSettings",
    "ContextEditingSettings",
    "DatabaseSettings",
    "ModelLimits",
    "RetentionSettings",
    "ServerSettings",
    "Settings",
    "SettingsError",
    "Upstream",
    "UpstreamDefaults",
    "load_settings",
]


class SettingsError(ValueError):
    """The configuration file or an environment variable is invalid."""


class ServerSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    host: str
    port: int
    lease_seconds: float
    context_mode: Literal["delta", "full"]
    unsupported_tools: Literal["drop", "refuse"]
    upstream_objects: Literal["pass", "refuse"]  # an upstream account every tenant shares: its objects passed through or not
    session_headers: tuple[str, ...]  # under /auto/v1 without X-Conversation-Id: headers naming the conversation
    reaper_interval_seconds: float
    max_body_bytes: int
    max_bytes_in_flight: int
    max_response_bytes: int
    max_response_header_bytes: int
    max_response_headers: int
    client_body_timeout: float
    client_header_timeout: float
    client_send_timeout: float
    max_connections: int
    shutdown_grace_seconds: float
    path_cache_mb: int
    metrics_token: str
    log_level: str
    log_format: Literal["json", "text"]

    @property
    def reaper_interval(self) -> float:
        if self.reaper_interval_seconds > 0:
            return self.reaper_interval_seconds
        return max(1.0, self.lease_seconds / 4)


class DatabaseSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str
    data_dir: str
    pool_min: int
    pool_max: int
    command_timeout: float
    connect_timeout: float
    embedded_batch_scheduling: bool
    batch_calls: bool
    share_items_above: int  # bytes: system items and request fields this large are stored once per tenant (0: never)


class AuthKey(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str
    tenant: str = ""
    admin: bool = False


class AuthSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mode: Literal["passthrough", "keys", "none"]
    keys: tuple[AuthKey, ...]


class UpstreamDefaults(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    connect_timeout: float
    read_timeout: float
    write_timeout: float
    pool_timeout: float
    max_connections: int
    keepalive_expiry: float
    transport: Literal["builtin", "httpx", "aiohttp"]
    ca_bundle: str  # PEM file of CAs to trust for https upstreams (empty: the certifi bundle)


class Upstream(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    base_url: str
    api_key: str = ""
    models: tuple[str, ...] = ("*",)
    accepts_reasoning: bool = False
    api: Literal["chat", "responses", "anthropic"] = "chat"  # what this upstream speaks

    def matches(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


class ModelLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    context_window: int
    max_output_tokens: int

    @property
    def input_limit(self) -> int:
        return max(1, self.context_window - self.max_output_tokens)


class CompactionSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    soft: float
    hard: float
    keep_recent: int
    summary_budget: float
    model: str


class ContextEditingSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    clear_tool_results: float  # share of the input limit above which old tool results are cleared; 0: off
    keep_tool_results: int  # the most recent tool results are never cleared
    clear_at_least: float  # clear only when it frees at least this share of the input limit
    exclude_tools: tuple[str, ...]  # tools whose results are never cleared


class RetentionSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    idle_days: float  # delete conversations idle this long; 0: keep everything
    interval_seconds: float
    batch: int


class Settings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    server: ServerSettings
    database: DatabaseSettings
    auth: AuthSettings
    upstream_defaults: UpstreamDefaults
    upstreams: tuple[Upstream, ...]
    models: dict[str, ModelLimits]
    compaction: CompactionSettings
    context_editing: ContextEditingSettings
    retention: RetentionSettings

    def upstream_for(self, model: str) -> Upstream | None:
        """The first upstream whose model globs match ``model``."""
        for upstream in self.upstreams:
            if upstream.matches(model):
                return upstream
        return None

    def limits_for(self, model: str) -> ModelLimits:
        """The limits of the most specific glob matching ``model`` (most literal characters)."""
        best: tuple[int, ModelLimits] | None = None
        for pattern, limits in self.models.items():
            if fnmatch.fnmatchcase(model, pattern):
                score = sum(1 for ch in pattern if ch not in "*?[]")
                if best is None or score > best[0]:
                    best = (score, limits)
        if best is None:  # unreachable while defaults.toml has [models."*"], which no file can remove
            raise SettingsError(f"no [models] entry matches {model!r}")
        return best[1]


def _deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; every other value (arrays included) replaces the default."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _defaults() -> dict[str, Any]:
    text = resources.files("config").joinpath("defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    raw = dict(raw)
    database = dict(raw.get("database", {}))
    if "BRANCHPOINT_DATABASE_URL" in env:  # (set empty: the embedded PostgreSQL, whatever the file says)
        database["url"] = env["BRANCHPOINT_DATABASE_URL"].strip()
    if env.get("BRANCHPOINT_DATA_DIR"):
        database["data_dir"] = env["BRANCHPOINT_DATA_DIR"]
    raw["database"] = database

    url = env.get("BRANCHPOINT_UPSTREAM_URL")
    key = env.get("BRANCHPOINT_UPSTREAM_API_KEY")  # (set empty: the client's key is forwarded)
    if url or key is not None:
        upstreams = [dict(u) for u in raw.get("upstreams", [])]
        if not upstreams:
            upstreams = [{"name": "default", "base_url": url or "https://api.openai.com/v1"}]
        # "the default upstream" is the catch-all one; without a catch-all, the first
        targets = [u for u in upstreams if "*" in u.get("models", ["*"])] or upstreams[:1]
        for upstream in targets:
            if url:
                upstream["base_url"] = url
            if key is not None:
                upstream["api_key"] = key
        raw["upstreams"] = upstreams
    return raw


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings: defaults, then ``path`` (or ``$BRANCHPOINT_CONFIG``), then the
    environment, then ``overrides`` (a dict shaped like the TOML file; used by tests)."""
    env = os.environ if env is None else env
    raw = _defaults()
    path = path or env.get("BRANCHPOINT_CONFIG") or None
    if path:
        try:
            with Path(path).open("rb") as fh:
                raw = _deep_merge(raw, tomllib.load(fh))
        except OSError as exc:
            raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from exc
    raw = _apply_env(raw, env)
    if overrides:
        raw = _deep_merge(raw, overrides)
    try:
        settings = msgspec.convert(raw, Settings)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"invalid configuration: {_located(exc, raw)}") from exc
    _validate(settings)
    return settings


def _located(exc: msgspec.ValidationError, raw: dict[str, Any]) -> str:
    """msgspec's message, with a ``[models]`` entry named by its glob: msgspec says ``[...]`` for
    any key of a table, and with several entries (the defaults hold some) nobody could tell which."""
    text = str(exc)
    models = raw.get("models")
    if "`$.models[...]" not in text or not isinstance(models, dict):
        return text
    for glob, entry in models.items():
        try:
            msgspec.convert(entry, ModelLimits)
        except msgspec.ValidationError as inner:
            said, where = str(inner), f'`$.models."{glob}"'
            return said.replace(" - at `$", f" - at {where}", 1) if " - at `$" in said else f"{said} - at {where}`"
    return text


_LOG_LEVELS = frozenset(logging.getLevelNamesMapping())  # (what logging takes: WARN and FATAL too)


def _non_finite(value: Any, where: str = "") -> str | None:
    """The first setting (dotted) holding a float that is not a finite number (``nan``, ``inf``:
    every comparison with them is false, so no range check would catch them), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            found = _non_finite(getattr(value, name), f"{where}.{name}" if where else name)
            if found:
                return found
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            if found := _non_finite(item, f"{where}[{i}]"):
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            if found := _non_finite(item, f"{where}.{key}"):
                return found
    return None


def _url_ok(url: str, schemes: tuple[str, ...]) -> bool:
    """A URL of one of ``schemes``: with a host for http(s); a PostgreSQL one may leave it to libpq's
    defaults (``postgresql://``, ``?host=/socket``)."""
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme in schemes and (parts.scheme.startswith("postgres") or bool(parts.hostname))
    except ValueError:  # (a malformed IPv6 host)
        return False


def _bad_port(url: str) -> bool:
    """Does a host of the URL (each of a PostgreSQL URL's several: ``h1:5432,h2:5433``) give a
    port that is none -- not a number (percent-encoded digits are one), or out of 1..65535? An
    unencoded ``#``, ``?`` or ``/`` in a password ends the address there, and what follows its
    ``:`` reads as the port: the value is never said (it may be the password)."""
    for host in urllib.parse.urlsplit(url).netloc.rpartition("@")[2].split(","):
        after = host.rpartition("]")[2] if host.startswith("[") else host  # (an IPv6 address: its port after ])
        if ":" not in after:
            continue
        port = urllib.parse.unquote(after.rpartition(":")[2])
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            return True
    return False


# The longest span a setting may give (about 31 years): a lease's end and retention's cutoff are
# times now plus or minus it -- PostgreSQL's interval and Python's dates end far beyond, but not at
# any float (a lease of 1e13 s made every call 500).
MOST_SECONDS = 1e9


def _validate(settings: Settings) -> None:
    if (where := _non_finite(settings)) is not None:
        raise SettingsError(f"{where} must be a finite number")
    s, d, u = settings.server, settings.database, settings.upstream_defaults
    if not 1 <= s.port <= 65535:
        raise SettingsError("server.port must be in 1..65535")
    if s.log_level.upper() not in _LOG_LEVELS:
        raise SettingsError(f"server.log_level must be one of {', '.join(sorted(_LOG_LEVELS))} (any case)")
    if d.pool_max < 1 or not 0 <= d.pool_min <= d.pool_max:
        raise SettingsError("database.pool_max must be >= 1 and database.pool_min in 0..pool_max")
    if d.command_timeout <= 0 or d.connect_timeout <= 0:
        raise SettingsError("database.command_timeout and database.connect_timeout must be > 0")
    if d.url and not _url_ok(d.url, ("postgres", "postgresql")):
        raise SettingsError("database.url (BRANCHPOINT_DATABASE_URL) must be a postgresql:// URL")
    if d.url and _bad_port(d.url):
        raise SettingsError("database.url (BRANCHPOINT_DATABASE_URL): a port is not a number in 1..65535 -- a '#', "
                            "'?' or '/' in the user name or password must be percent-encoded (%23, %3F, %2F)")
    if min(u.connect_timeout, u.read_timeout, u.write_timeout, u.pool_timeout) <= 0 or u.keepalive_expiry < 0:
        raise SettingsError("upstream_defaults' timeouts must be > 0 (and keepalive_expiry >= 0)")
    if u.max_connections < 1:
        raise SettingsError("upstream_defaults.max_connections must be >= 1")
    if s.max_connections < 1:  # (uvicorn's limit_concurrency: 0 would answer every request 503)
        raise SettingsError("server.max_connections must be >= 1")
    if u.ca_bundle and not os.path.isfile(u.ca_bundle):
        raise SettingsError(f"upstream_defaults.ca_bundle: no such file {u.ca_bundle!r}")
    for upstream in settings.upstreams:
        if (not _url_ok(upstream.base_url, ("http", "https")) or any(c in upstream.base_url for c in "?#")
                or _bad_port(upstream.base_url)):
            raise SettingsError(f"upstreams {upstream.name!r}: base_url must be an http:// or https:// URL without "
                                "a query or fragment, its port (if any) a number in 1..65535 -- each endpoint's path "
                                "goes after it -- "
                                f"(BRANCHPOINT_UPSTREAM_URL for the default one), not {upstream.base_url!r}")
    seen: set[str] = set()
    for entry in settings.auth.keys:
        if entry.key != entry.key.strip() or not entry.key:  # (a client's key is read stripped: it could never match)
            raise SettingsError("auth.keys: a key is empty or has spaces around it")
        hashed = entry.key.startswith("sha256:")
        if hashed and not re.fullmatch(r"[0-9a-fA-F]{64}", entry.key[7:]):
            raise SettingsError("auth.keys: a sha256: key is 64 hexadecimal digits")
        digest = entry.key[7:].lower() if hashed else hashlib.sha256(entry.key.encode()).hexdigest()
        if digest in seen:  # (in clear or hashed, any case: as the proxy compares them)
            raise SettingsError("auth.keys: a key is listed twice (which tenant, which rights?)")
        seen.add(digest)
    c = settings.compaction
    if not 0 < c.soft <= 1 or not 0 < c.hard <= 1:
        raise SettingsError("compaction.soft and compaction.hard must be in (0, 1]")
    if not 0 < c.summary_budget < 1:
        raise SettingsError("compaction.summary_budget must be in (0, 1)")
    if c.keep_recent < 0:
        raise SettingsError("compaction.keep_recent must be >= 0")
    e = settings.context_editing
    if not 0 <= e.clear_tool_results <= 1:
        raise SettingsError("context_editing.clear_tool_results must be in [0, 1] (0: off)")
    if not 0 <= e.clear_at_least < 1:
        raise SettingsError("context_editing.clear_at_least must be in [0, 1)")
    if e.keep_tool_results < 0:
        raise SettingsError("context_editing.keep_tool_results must be >= 0")
    if settings.database.share_items_above < 0:
        raise SettingsError("database.share_items_above must be >= 0 (0: nothing is shared)")
    if not 0 < settings.server.lease_seconds <= MOST_SECONDS:  # (a lease's end is a timestamp in PostgreSQL)
        raise SettingsError(f"server.lease_seconds must be > 0 and at most {MOST_SECONDS:.0f} (about 31 years)")
    if settings.server.client_body_timeout < 0 or settings.server.client_header_timeout < 0:
        raise SettingsError("server.client_body_timeout and server.client_header_timeout must be >= 0 (0: no limit)")
    if settings.server.max_response_bytes <= 0 or settings.server.max_body_bytes <= 0:
        raise SettingsError("server.max_response_bytes and server.max_body_bytes must be > 0")
    if settings.server.max_bytes_in_flight < 0:
        raise SettingsError("server.max_bytes_in_flight must be >= 0 (0: no bound)")
    if settings.server.client_send_timeout < 0:
        raise SettingsError("server.client_send_timeout must be >= 0 (0: no limit)")
    if settings.server.max_response_header_bytes <= 0 or settings.server.max_response_headers <= 0:
        raise SettingsError("server.max_response_header_bytes and server.max_response_headers must be > 0")
    if settings.server.shutdown_grace_seconds < 0:
        raise SettingsError("server.shutdown_grace_seconds must be >= 0")
    if settings.server.path_cache_mb < 0:
        raise SettingsError("server.path_cache_mb must be >= 0")
    r = settings.retention
    if r.idle_days < 0 or r.interval_seconds <= 0 or r.batch < 1:
        raise SettingsError("retention.idle_days must be >= 0, retention.interval_seconds > 0, retention.batch >= 1")
    if r.idle_days * 86400 > MOST_SECONDS:  # (its cutoff is a date: now less idle_days)
        raise SettingsError(f"retention.idle_days must be at most {MOST_SECONDS / 86400:.0f} (0: keep everything)")
    if not settings.upstreams:
        raise SettingsError("at least one [[upstreams]] entry is needed")
    names = [u.name for u in settings.upstreams]
    if len(set(names)) != len(names):
        raise SettingsError("upstream names must be unique")
    for glob, limits in settings.models.items():
        if not 0 <= limits.max_output_tokens < limits.context_window:
            raise SettingsError(f'models."{glob}": max_output_tokens must be >= 0 and below context_window')
    if settings.auth.mode == "keys" and not settings.auth.keys:
        raise SettingsError('auth.mode = "keys" needs at least one [[auth.keys]] entry')
