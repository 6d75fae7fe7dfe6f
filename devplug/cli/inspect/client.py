"""The kubelet's side of one device plugin socket, for ``devplug inspect``.

Works with any plugin, not only devplug's: everything it received is kept as sent (health
strings included), and every failure is an :class:`InspectError` with one line saying what is
wrong with the socket, so the command can print it instead of a traceback. The calls go through
the fake kubelet's client (:class:`devplug.testing._kubelet.rpc.PluginClient`), imported when
a connection is made.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import grpc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from devplug.models import PluginOptions
    from devplug.testing._kubelet.rpc import DeviceLists

T = TypeVar("T")
_MAX_UNIX_PATH = 107  # sun_path is 108 bytes on Linux, one of which is the terminating NUL


class InspectError(Exception):
    """Talking to the socket failed; the message is one line for the user."""


@dataclass(frozen=True)
class SeenDevice:
    """One device of a ListAndWatch message, exactly as the plugin sent it."""

    id: str
    health: str
    numa_nodes: tuple[int, ...]

    @property
    def healthy(self) -> bool:
        """The kubelet's reading: only the exact string ``"Healthy"`` is healthy."""
        return self.health == "Healthy"


def check_socket(path: str) -> str:
    """Return the absolute path of ``path`` once something is listening on it.

    Raises:
        InspectError: the path is missing, not a socket, too long, or nobody listens on it.
    """
    absolute = os.path.abspath(path)
    try:
        mode = os.stat(absolute).st_mode
    except FileNotFoundError:
        raise InspectError(f"{path}: no such file") from None
    except OSError as exc:
        raise InspectError(f"{path}: cannot stat: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        kind = (
            "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else "no socket"
        )
        raise InspectError(f"{path}: not a socket ({kind})")
    if len(absolute.encode()) > _MAX_UNIX_PATH:
        raise InspectError(f"{path}: path too long for a unix socket ({len(absolute.encode())} bytes > 107)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        # A unix connect completes or is refused at once; refused means a stale socket file.
        probe.setblocking(False)
        try:
            probe.connect(absolute)
        except BlockingIOError:
            pass  # listening, backlog full
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                raise InspectError(
                    f"{path}: nobody is listening on this socket (stale socket file?)"
                ) from None
            raise InspectError(f"{path}: cannot connect: {exc.strerror}") from None
    return absolute


class PluginConnection:
    """A gRPC channel to one plugin socket and the calls the kubelet makes, each with a deadline.

    The channel has the kubelet's options (no keepalive, gRPC-Go's 4 MiB receive limit): a
    larger ListAndWatch message fails here exactly as it fails there.
    """

    def __init__(self, path: str, *, timeout: float) -> None:
        from devplug.testing._kubelet.rpc import PluginClient, open_channel

        self.path = path
        self.timeout = timeout
        self._client = PluginClient(open_channel(path), deadline=timeout)
        self._stream: DeviceLists | None = None

    async def close(self) -> None:
        """Cancel the ListAndWatch stream, if any, and close the channel."""
        if self._stream is not None:
            self._stream.cancel()
        await self._client.close()

    async def options(self) -> PluginOptions:
        """GetDevicePluginOptions: the first call, so its failure says what the socket is.

        Raises:
            InspectError: not gRPC, not the device plugin service, or no answer in time.
        """
        try:
            return await self._client.get_options()
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                reason = (
                    f"no answer to GetDevicePluginOptions within {self.timeout:g} s "
                    "(not a gRPC server, or a hung one)"
                )
            elif code is grpc.StatusCode.UNAVAILABLE:
                reason = f"does not speak gRPC ({_first_line(exc.details())})"
            elif code is grpc.StatusCode.UNIMPLEMENTED:
                reason = (
                    "speaks gRPC but not the device plugin protocol (GetDevicePluginOptions: UNIMPLEMENTED)"
                )
            else:
                reason = f"GetDevicePluginOptions failed: {status(exc)}"
            raise InspectError(f"{self.path}: {reason}") from None

    async def next_list(self, *, within: float | None) -> list[SeenDevice] | None:
        """The next ListAndWatch message (the stream opens on the first call); ``None`` on timeout.

        Raises:
            InspectError: the stream failed, or the plugin ended it (the kubelet would then mark
                every device unhealthy).
        """
        if self._stream is None:
            self._stream = self._client.list_and_watch()
        devices = None
        try:
            with anyio.move_on_after(within):
                devices = await anext(self._stream)
        except StopAsyncIteration:
            raise InspectError(
                f"{self.path}: the plugin ended ListAndWatch (the kubelet marks every device unhealthy)"
            ) from None
        except grpc.aio.AioRpcError as exc:
            hint = (
                " (the kubelet drops messages over 4 MiB too)"
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                else ""
            )
            raise InspectError(f"{self.path}: ListAndWatch failed: {status(exc)}{hint}") from None
        if devices is None:
            return None
        return [SeenDevice(*device) for device in devices]

    async def allocate(self, device_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Allocate for one container, as at pod admission; every container response, as sent."""
        responses = await _call("Allocate", self._client.allocate([device_ids]))
        # Plain data, as sent: inspect shows what a plugin answers even where devplug would refuse it.
        return [response.model_dump(mode="json") for response in responses]

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """GetPreferredAllocation for one container; ``None`` when it answered no container response."""
        return await _call("GetPreferredAllocation", self._client.preferred(available, must_include, size))

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer with one container's device IDs."""
        await _call("PreStartContainer", self._client.pre_start(device_ids))


async def _call(method: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise InspectError(f"{method} failed: {status(exc)}") from None


def status(exc: grpc.aio.AioRpcError) -> str:
    """A failed call's status for a message: its code and the first line of its details."""
    return f"{exc.code().name}: {_first_line(exc.details())}"


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "no details"


async def follow_until_signalled(follow: Callable[[], Awaitable[None]]) -> str | None:
    """Run ``follow`` until Ctrl-C or SIGTERM, or until it fails; its failure's message, or ``None``.

    A ``--watch`` (device plugin or DRA) stopped by a signal ends normally, with status 0:
    following the stream is the point. A signal before this (connecting, the first calls) is
    an interruption instead: status 130.
    """
    from devplug._runtime.signals import until_signalled

    try:
        await until_signalled(follow)
    except InspectError as exc:
        return str(exc)
    return None
