"""Class labels: integers as they are, or class names mapped to integers.

A source's labels are either all integers (``3``, ``"3"``) and used as they are, or
class names (``"cat"``), in which case the sorted distinct names are numbered 0..K-1
and the list is recorded in the manifest as ``classes`` (label id = index). Sorted,
not first-seen, so that the ids do not depend on the order (or the seed) in which
samples are read.

The decision needs every label before the first sample is written (a shard is
hashed as it streams out), so sources scan their labels up front: a table's are in
memory already; a tar's ``cls``/``json`` members are cheap to read on their own.

Trap: one name among integers makes every label a name (``"3"`` included), since a
mixed column has no consistent meaning otherwise; a float column written by pandas
(``1.0``) is names too. The manifest's ``classes`` shows what happened.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_INTEGER = re.compile(r"^[+-]?\d+$")


def label_text(raw: object) -> str | None:
    """A label as text; None for no label. Raises ValueError for a value that cannot be one."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise ValueError(f"{raw!r} is neither an integer nor a class name")
    text = str(raw).strip()
    return text or None


class Labels:
    """Maps raw labels to integer ids, decided once from all of a source's raw labels."""

    def __init__(self, raw: Iterable[object]) -> None:
        texts: set[str] = set()
        for value in raw:
            try:
                text = label_text(value)
            except ValueError:
                continue  # reported as a bad label when its sample is read
            if text is not None:
                texts.add(text)
        named = any(not _INTEGER.match(t) for t in texts)
        self.classes: list[str] | None = sorted(texts) if named else None
        self._ids = {name: i for i, name in enumerate(self.classes or [])}

    def __call__(self, raw: object) -> int | None:
        """The label id; raises ValueError (with the reason) for a bad label."""
        text = label_text(raw)
        if text is None:
            return None
        if self.classes is not None:
            if text not in self._ids:
                raise ValueError(f"class {text!r} was not seen when the labels were scanned")
            return self._ids[text]
        label = int(text)
        if label < 0:
            raise ValueError(f"negative label {label}")
        return label
