"""What every section of the worker config shares: frozen, keyword-only, unknown keys refused,
and the error that names the key."""

from __future__ import annotations

import msgspec


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


class Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


def check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{name} is {value}; it must be at least 1")
