"""Socket files: unique names, safe removal, and a gRPC server bound to one of them.

Rules (each one a bug some plugin shipped): one unique file name per server instance; an
existing file is dial-checked before it is removed; only sockets this process created are
removed; symlinks are never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import grpc
import structlog

from devplug._grpc_calls import await_call
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug.errors import ConfigError, DevplugError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

log = structlog.get_logger(__name__)

# sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_SOCKET_PATH = 107


def unique_socket_name(resource: str) -> str:
    """``<vendor>-<name>-<random>.sock`` for ``vendor/name``: never the same twice."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", resource.replace("/", "-")).strip("-.") or "plugin"
    return f"{base}-{secrets.token_hex(4)}.sock"


def is_live_socket(path: Path) -> bool:
    """True if something accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
        return True


class SocketUnavailableError(DevplugError):
    """A socket path that may not be used: too long, a symlink, another file, or in use."""


# What no retry mends: the directory refuses new files to this process (its mode, a read-only
# mount, an immutable directory), and the refusal stands until someone changes it.
_REFUSALS = (errno.EACCES, errno.EPERM, errno.EROFS)


def unwritable(directory: Path) -> str | None:
    """Why this process may not create sockets in ``directory``; None when it may, or when the
    directory is not there (it is waited for elsewhere).

    Judged as the kernel judges the process: the directory's mode, a read-only mount, an
    immutable directory.
    """
    if not directory.is_dir() or os.access(directory, os.W_OK | os.X_OK):
        return None
    return f"cannot create sockets in {directory}: it is not writable by this process (uid {os.geteuid()})"


def _bind_refusal(path: Path) -> ConfigError | None:
    """Why binding ``path`` failed, when the reason is one no retry mends (grpc only says that
    it failed): found by binding a plain socket there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(os.fspath(path))
        except OSError as exc:
            if exc.errno not in _REFUSALS:
                return None
            return ConfigError(
                f"cannot create the socket {path}: {os.strerror(exc.errno).lower()} "
                f"(the directory must be writable by this process, uid {os.geteuid()})"
            )
    with contextlib.suppress(OSError):  # it worked this time: not ours to explain
        os.unlink(path)
    return None


def claim_path(path: Path) -> None:
    """Make ``path`` free for a new socket, removing only a dead socket left at it.

    Raises SocketUnavailableError if the path is too long for a unix socket, is a symlink or another kind
    of file, or is a socket someone is serving on.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketUnavailableError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SocketUnavailableError(f"refusing to use {path}: it is a symlink")
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketUnavailableError(f"refusing to use {path}: it exists and is not a socket")
    if is_live_socket(path):
        raise SocketUnavailableError(f"refusing to use {path}: another process is serving on it")
    log.info("stale_socket_removed", socket=str(path))
    os.unlink(path)


def directory_exposure(directory: Path) -> str | None:
    """Why any user of the host could replace files in ``directory``, or None.

    ``directory`` (and, through a symlink, the directory it resolves to) must not be writable by
    others; a directory above it must not be either, unless it has the sticky bit (``/tmp``),
    which stops others from renaming or deleting what they do not own. Missing directories are
    not judged.
    """
    path = Path(os.path.abspath(directory))
    real = Path(os.path.realpath(path))
    leaves = {path, real}
    for current in dict.fromkeys([path, *path.parents, real, *real.parents]):
        try:
            mode = os.stat(current).st_mode
        except OSError:
            continue
        if not mode & stat.S_IWOTH:
            continue
        perms = f"mode {stat.S_IMODE(mode):04o}"
        if current in leaves:
            name = str(path) if real == path else f"{path} (resolving to {real})"
            return f"{name} is writable by every user ({perms})"
        if not mode & stat.S_ISVTX:
            return f"{current}, above {path}, is writable by every user without the sticky bit ({perms})"
    return None


def make_directories(directory: Path) -> None:
    """Create ``directory`` and its missing parents with mode 0755 at most, whatever the umask.

    ``os.makedirs`` gives parents the umask's mode, which a umask of 0 makes writable by all.
    """
    path = Path(os.path.abspath(directory))
    for current in [*reversed(path.parents), path]:
        if current.is_dir():
            continue
        with contextlib.suppress(FileExistsError):
            os.mkdir(current, 0o755)


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, ctime) of ``path`` itself (not a link target), or None if absent."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class SocketServer:
    """A grpc.aio server on one socket file it owns; ``stop`` is idempotent."""

    def __init__(
        self,
        path: Path,
        add_services: Callable[[grpc.aio.Server], None],
        check: Callable[[Path], Awaitable[None]] | None = None,
    ) -> None:
        """``check`` dials the new socket as its client will (default: a device plugin's
        GetDevicePluginOptions) and raises grpc.aio.AioRpcError or TimeoutError if it does not
        answer."""
        self.path = path
        self._add_services = add_services
        self._check = check or self_dial
        self._server: grpc.aio.Server | None = None
        self._identity: tuple[int, int, int] | None = None

    async def start(self) -> None:
        """Bind, start, and check by dialling back that the socket answers.

        Raises:
            SocketUnavailableError: the path may not be used (see :func:`claim_path`), its
                directory is gone, or the new server does not answer its own call.
            ConfigError: the directory refuses new files to this process (permission denied,
                a read-only mount): no retry would mend it.
        """
        claim_path(self.path)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self._add_services(server)
        # Only the kubelet (root) should talk to a plugin: 0600 whatever the umask was. The
        # socket listens from bind on, so a chmod afterwards would leave a moment in which
        # anyone may connect (the permission is checked at connect only) and keep that
        # connection: bind under a umask that already yields 0600.
        umask = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError:
            if not self.path.parent.is_dir():
                # Deleted since it was seen (a kubelet being reinstalled): the caller waits for it.
                raise SocketUnavailableError(f"the directory {self.path.parent} is gone") from None
            refusal = _bind_refusal(self.path)
            if refusal is None:
                raise
            raise refusal from None
        finally:
            os.umask(umask)
        st = os.lstat(self.path)  # never chmod a path: it would follow a symlink put there
        if not stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) & 0o177:
            await server.stop(0)
            raise SocketUnavailableError(
                f"{self.path} is not the private socket just bound (mode {stat.S_IMODE(st.st_mode):04o})"
            )
        self._server = server
        self._identity = file_identity(self.path)
        # Shielded: a cancellation while grpc's server loop is starting leaves that loop's task
        # to fail later with InvalidStateError ("Task exception was never retrieved").
        with anyio.CancelScope(shield=True):
            await server.start()
        try:
            # Shielded (each check has its own 2 s deadline): a grpc.aio call cancelled from
            # outside can raise a CancelledError of its own that escapes the cancel scope which
            # asked for it (seen with SIGTERM arriving during start-up). A cancellation that came
            # meanwhile is delivered at the checkpoint below.
            with anyio.CancelScope(shield=True):
                await self._check(self.path)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            if not self.alive():
                # A restarting kubelet deleted the socket already; the caller sees the socket
                # is gone and starts over, as after any deletion.
                log.info("socket_deleted_while_starting", socket=str(self.path))
                return
            await self.stop(0)
            why = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "no answer within 2 s"
            raise SocketUnavailableError(f"{self.path} does not answer its own call: {why}") from None
        await anyio.lowlevel.checkpoint()

    def alive(self) -> bool:
        """True while the socket file is still the one this server created."""
        return self._identity is not None and file_identity(self.path) == self._identity

    async def stop(self, grace: float = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        # Remove the file only if it is still ours: after a kubelet restart the path may be
        # gone, and a path is never reused, so anything else there is someone else's.
        if self._identity is not None and file_identity(self.path) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._identity = None


async def self_dial(path: Path, timeout: float = 2.0) -> None:  # noqa: ASYNC109 - a grpc deadline
    """Call GetDevicePluginOptions on ``path`` as the kubelet will during Register.

    Not wait-for-ready: the server is already listening, so a refused connection means the
    file is gone and should fail now, not after the timeout.
    """
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub: Any = pb_grpc.DevicePluginStub(channel)
        await await_call(stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout))
