"""The one error type of bad input, at the bottom of the house so every stage can raise it.

A ``SpecError`` means the user gave something unusable: an unknown model, a malformed run
spec, an impossible size, a bad data set. Its message is ONE line naming the culprit;
``scaleladder``'s dispatcher prints it and exits 2. It lives here, not in ``spec``,
because the model registry (``flavors``) raises it too and ``spec`` reads the registry:
with the class in ``spec`` the two would import each other.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A run spec (or part of one) is malformed. The message is one line naming the culprit."""


class WriteError(Exception):
    """An output could not be written (disk full, quota, read-only, ``ulimit -f``). The
    message is ONE line naming the file and the cause; the dispatcher prints it, exit 1."""
