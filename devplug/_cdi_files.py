"""CDI spec files on disk: their names, atomic writes and removal (used by :mod:`devplug.cdi`).

Runtimes (containerd, CRI-O) watch the CDI directories and reload a file when it changes, so a
reader must never see a half-written spec: write a temporary file in the same directory, fsync
it, then rename it over the old one. The temporary name ends in ``.tmp`` and starts with a dot,
so a runtime scanning for ``*.json`` never loads it.

This module knows file names and bytes, not specs: :func:`devplug.cdi.write_spec` turns a spec
into its file's name and text and hands them to :func:`write_atomically`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

__all__ = ["DEFAULT_CDI_DIR", "remove_spec", "spec_file_name", "write_atomically"]

DEFAULT_CDI_DIR = Path("/var/run/cdi")
"""Where dynamically generated specs go (``/etc/cdi`` is for static ones)."""


def spec_file_name(kind: str) -> str:
    """``vendor.com/class`` → ``vendor.com-class.json``."""
    vendor, _, klass = kind.partition("/")
    return f"{vendor}-{klass}.json"


_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomically(
    directory: str | os.PathLike[str], name: str, data: str | bytes, mode: int = 0o644
) -> Path:
    """Write ``data`` as ``<directory>/<name>`` (``mode``), replacing any old file in one step.

    A reader sees the old file or the new one, never a part of either, and the new one is on
    disk (the file, then its directory entry) before this returns. The temporary file is
    ``.<name>.<pid>.<thread>.tmp``: no two writers share one (a DRA driver's prepare writes a
    spec and its checkpoint this way, so ``tempfile.mkstemp``'s search is saved), and a link
    in its place is refused, not followed. The directory is created when it is missing.
    Returns the file's path.

    Raises:
        OSError: the directory or the file could not be written (the old file, if any, stays).
    """
    folder = Path(directory)
    path = folder / name
    payload = data.encode() if isinstance(data, str) else data
    tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        try:
            fd = os.open(tmp, _FLAGS, mode)
        except FileNotFoundError:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, _FLAGS, mode)
    except OSError as exc:
        if exc.filename == str(tmp):
            exc.filename = str(path)  # the file a user knows of, not the temporary one
        raise
    try:
        try:
            os.fchmod(fd, mode)  # the umask narrows os.open's mode; runtimes may read as another user
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(folder)
    return path


def remove_spec(kind: str, directory: str | os.PathLike[str] = DEFAULT_CDI_DIR) -> bool:
    """Remove the spec file of ``kind`` from ``directory``; False if there was none.

    Raises:
        OSError: it exists but could not be removed.
    """
    try:
        (Path(directory) / spec_file_name(kind)).unlink()
    except FileNotFoundError:
        return False
    return True


def _fsync_directory(folder: Path) -> None:
    # The rename is durable only once the directory entry is on disk (matters for /etc/cdi;
    # /var/run/cdi is usually tmpfs, where this costs nothing).
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
