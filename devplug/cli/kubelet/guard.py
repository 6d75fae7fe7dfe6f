"""One ``devplug kubelet`` per directory, and the API server's address kept across restarts.

A second fake kubelet on a directory would take ``kubelet.sock`` over without a word (a
kubelet removes the socket before it listens), and the plugins would follow it. So the
directory that holds ``kubelet.sock`` is locked (``.devplug-kubelet.lock``, an ``flock`` the
kernel drops with the process: a killed kubelet leaves no lock that blocks the next), and a
socket some other server answers on is refused too.

``--dra`` writes the API server's address into ``ROOT/kubeconfig`` and keeps the file on the
way out: a run on the same root listens on that port again, so drivers started against the
last run (they read the kubeconfig once) reach the new API server.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pathlib import Path

LOCK_NAME = ".devplug-kubelet.lock"


class Taken(Exception):
    """Another kubelet serves the directory (the message says which)."""


class DirectoryLock:
    """The lock of a directory served by this process; :meth:`release` removes its file."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self._fd = -1

    def acquire(self) -> None:
        """Lock the directory (made if missing) and write this process's ID into the lock file.

        Raises:
            Taken: a live ``devplug kubelet`` holds it, or a server answers on its ``kubelet.sock``.
            OSError: the directory or the lock file cannot be made.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                pid = f" (pid {holder})" if holder.isdigit() else ""
                raise Taken(
                    f"another devplug kubelet{pid} serves {self.path.parent}; stop it first"
                ) from None
            # The holder before may have removed the file between our open and our lock: then
            # the lock is on a file no one else will open; lock the one at the path instead.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        socket_path = self.path.parent / "kubelet.sock"
        if _answers(socket_path):
            self.release()
            raise Taken(f"a kubelet already serves {socket_path}; stop it first")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        """Remove the lock file and drop the lock. Safe to call twice."""
        if self._fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = -1


def _answers(path: Path) -> bool:
    """Whether a server accepts connections on the unix socket ``path`` (a stale file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:  # no file, a stale socket (refused), a path too long: nobody serves it
            return False
    return True


def previous_port(kubeconfig: Path) -> int:
    """The 127.0.0.1 port of the server in the kubeconfig an earlier run wrote (0: none)."""
    try:
        config = json.loads(kubeconfig.read_text())
        url = urlsplit(config["clusters"][0]["cluster"]["server"])
        port = url.port if url.hostname == "127.0.0.1" else None
    except (OSError, ValueError, LookupError, TypeError, AttributeError):
        return 0
    return port or 0


def port_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be listened on (as the API server binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
