"""How the generated site/settings.py reads a validated config section: the helpers each class's
``of`` calls. Hand-written, so that the generated module holds only the schema's classes.

Every error is a :class:`ConfigError` naming the key as a user types it (``site.lancher``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from scaleladder.site.config import ConfigError

__all__ = ["key_of", "section", "required", "pairs", "as_tuple"]

T = TypeVar("T")


def key_of(key: str, name: str) -> str:
    """The dotted key a user types: ``site.env``; a top-level key alone."""
    return f"{key}.{name}" if key else name


def section(m: object, key: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    """``m`` as a mapping whose every key the schema knows (else one line naming it)."""
    if not isinstance(m, Mapping):
        raise ConfigError(f"config key {key or '(top level)'!r}: expected a mapping, got {m!r}")
    for k in m:
        if k not in known:
            raise ConfigError(f"config key {key_of(key, str(k))!r}: unknown key (the keys here: {', '.join(known)})")
    return m


def required(m: Mapping[str, Any], name: str, key: str) -> Any:
    """``m[name]``, which the schema requires (else one line naming it)."""
    if name not in m:
        raise ConfigError(f"config key {key_of(key, name)!r}: required, and not given")
    return m[name]


def pairs(m: Mapping[str, T] | None) -> tuple[tuple[str, T], ...]:
    """A free-form mapping (``site.env``) as ``(key, value)`` pairs, in the config's order."""
    return tuple((m or {}).items())


def as_tuple(v: list[T] | tuple[T, ...] | T) -> tuple[T, ...] | T:
    """A value the schema allows as a list or a scalar (``select.models``): a list as a tuple."""
    return tuple(v) if isinstance(v, (list, tuple)) else v
