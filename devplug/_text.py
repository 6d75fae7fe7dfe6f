"""Words for people: counts with their nouns, system errors as sentences, rounded numbers.

Pure functions, no I/O: what a message, a command's output or a log line says, written once so
that every place says it the same way.
"""

from __future__ import annotations

import errno
import math

__all__ = ["counted", "os_error_text", "rounded"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and its noun, singular for one: ``1 slice``, ``2 slices``, ``0 entries``
    (``plural`` where adding "s" is wrong)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


# errno → the words that replace strerror's ("File exists" reads oddly after "cannot create X").
_REASONS = {
    errno.EEXIST: "it exists",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "it is a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
    errno.EADDRINUSE: "address already in use",
}


def os_error_text(exc: OSError, doing: str | None = None) -> str:
    """An OSError as a sentence a user reads, not Python's ``[Errno 17] File exists: 'x'``.

    ``doing`` is what failed, as a verb phrase (``"create the CDI directory"``); the path the
    error names follows it: ``cannot create the CDI directory /var/run/cdi: permission denied``.
    Without ``doing``: ``/var/run/cdi: permission denied``. An OSError without an errno (raised
    with a message of its own) keeps its message.
    """
    if exc.errno is None or not exc.strerror:
        reason = str(exc)
    else:
        reason = _REASONS.get(exc.errno, exc.strerror[:1].lower() + exc.strerror[1:])
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    where = " -> ".join(paths)
    if doing is not None:
        subject = f"cannot {doing}" + (f" {where}" if where and where not in doing else "")
        return f"{subject}: {reason}"
    return f"{where}: {reason}" if where else reason


def rounded(seconds: float) -> float:
    """A duration for a log line or a message: three significant digits, to the microsecond at
    most (0.123456789 -> 0.123, 12.3456 -> 12.3, 1234.56 -> 1235.0, 0.000123456 -> 0.000123)."""
    if seconds == 0 or not math.isfinite(seconds):
        return seconds
    digits = 2 - math.floor(math.log10(abs(seconds)))
    return round(seconds, min(6, max(0, digits)))


def cut_to_bytes(text: str, limit: int, *, errors: str = "ignore") -> str:
    """``text`` if its UTF-8 takes at most ``limit`` bytes, else its first ``limit - 3`` bytes and
    ``...``, as Go cuts a string (``s[:n-3] + "..."``). A character cut in two is dropped
    (``errors="ignore"``) or shown as U+FFFD (``"replace"``, what Go's broken byte becomes).
    """
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors=errors) + "..."
