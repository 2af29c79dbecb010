"""Configuration: TOML defaults shipped in ``defaults.toml``, a user file, environment overrides."""

from .settings import (
    AuthKey,
    AuthSettings,
    CompactionSettings,
    DatabaseSettings,
    ModelLimits,
    RetentionSettings,
    ServerSettings,
    Settings,
    SettingsError,
    Upstream,
    UpstreamDefaults,
    load_settings,
)

__all__ = [
    "AuthKey",
    "AuthSettings",
    "CompactionSettings",
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
