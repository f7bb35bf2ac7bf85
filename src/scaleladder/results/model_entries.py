"""A models-file model named in a record is known to whoever reads the record.

A rung of a user's model (a models-file entry: docs/your-model.md) carries its entry in its
record (``model_entry``: source, name, keyword arguments, as JSON). Every reader registers the
model from it before parsing the rung's spec (the spec's model must be known), so aggregating,
plotting, comparing and pricing a ladder need no models file, and read the same on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scaleladder.results.record import Settings, Spec


def register_recorded(attrs: Mapping[str, Any]) -> bool:
    """Register the model of a record's attributes when it carries an entry; True if it did."""
    entry, name = attrs.get(Settings.model_entry), attrs.get(Spec.model)
    if not entry or not name:
        return False
    from scaleladder.models.models_file import register_entry  # torch-free

    register_entry(_text(name), _text(entry))
    return True


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
