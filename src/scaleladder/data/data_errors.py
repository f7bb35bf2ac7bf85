"""The one error type of the data pipeline, and which rank prints it.

A ``DataError`` is bad input (a corrupt JPEG, a caption-less tar member, a shard
whose checksum does not match its manifest, ...). Its message is ONE line that
names the culprit file and, where there is one, the sample key.

It subclasses :class:`scaleladder.errors.SpecError` on purpose: ``scaleladder``'s
dispatcher turns a ``SpecError`` into the one-line message and exit code 2 (bad
input), so a bad manifest given to ``scaleladder run --data`` fails the same way as
a bad run spec, with no traceback.
"""

from __future__ import annotations

from scaleladder.errors import SpecError


class DataError(SpecError):
    """Bad input data. The message is one line naming the file (and key).

    ``speaker`` (see :func:`speaker`): whether this rank prints it, where
    :func:`scaleladder.data.preflight.agreed` decided that for every rank at once.
    """

    speaker: bool | None = None


def set_speaker(exc: BaseException, speaks: bool) -> None:
    """Mark ``exc`` with whether this rank prints it.

    Set by ``preflight.agreed``, the one place that knows every rank's verdict: of the
    ranks that found the same message the lowest prints it (so an error every rank found
    is printed once, by rank 0, and one only rank r found is printed by r), and a rank
    that only learned of another's error prints nothing. An attribute on the exception,
    not a DataError field: the failing rank re-raises its own error, whatever its type.
    """
    exc.speaker = speaks  # type: ignore[attr-defined]  # an ad hoc attribute on any exception type


def speaker(exc: BaseException) -> bool | None:
    """What :func:`set_speaker` said about ``exc``; None for an error no verdict was
    shared for (one process, or raised mid-run by one rank): its rank decides alone."""
    value = getattr(exc, "speaker", None)
    return value if isinstance(value, bool) else None


def one_line(exc: BaseException) -> str:
    """The last meaningful line of an exception's message.

    Trap: an exception raised inside a DataLoader worker comes back to the main
    process re-created as ``type(exc)("Caught X in DataLoader worker ...\\nOriginal
    Traceback ...")``: the whole worker traceback in the message. The culprit is
    on its last line, as ``module.Class: message``.
    """
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    last = lines[-1]
    for prefix in (f"{type(exc).__module__}.{type(exc).__qualname__}: ", f"{type(exc).__name__}: "):
        if last.startswith(prefix):
            return last[len(prefix):]
    return last
