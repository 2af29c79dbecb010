"""Configuration: TOML defaults shipped in ``defaults.toml``, a user file, environment overrides.
The package's names are ``config.settings``'s: its ``__all__``, listed once, there."""

from . import settings
from .settings import *  # noqa: F403

__all__ = settings.__all__
