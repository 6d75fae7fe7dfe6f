"""HTTP/1.1 for the fake API server: h11 over anyio TCP streams, keep-alive and chunked watches.

The server runs in an asyncio task of its own (not in a caller's task group), so that it can be
started and stopped from any task; halting with ``reset`` closes every open connection with a
TCP reset, as a crashed API server or a broken network path would.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

import anyio
import anyio.abc
import h11
import structlog
from anyio.abc import SocketAttribute, SocketStream

log = structlog.get_logger(__name__)

MAX_BODY = 3 * 1024 * 1024  # the API server's request size limit
_RECEIVE = 65536


@dataclass
class Request:
    """One request: the method, the unquoted path, the query (last value wins), headers in lower case."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Response:
    """A complete answer."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class StreamResponse:
    """A 200 answer sent in chunks as they come (a watch)."""

    chunks: AsyncGenerator[bytes, None]
    content_type: str = "application/json"


App = Callable[[Request], Awaitable["Response | StreamResponse"]]


class _Closed(Exception):
    """The peer went away, or broke the protocol."""


@dataclass
class _Run:
    """One listening period: from :meth:`HTTPServer.listen` to :meth:`HTTPServer.halt`."""

    sock: socket.socket
    task: asyncio.Task[None] | None = None
    halted: bool = False


class HTTPServer:
    """Serves ``app`` on 127.0.0.1; :meth:`listen` again after :meth:`halt` reuses the port.

    ``listen`` and ``halt`` are synchronous, so that an outage starts and ends at a precise
    point of a test: from ``halt`` on, connections are refused (the listening socket is shut
    down at once) and requests already under way get no answer.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self.port = 0
        self._run: _Run | None = None
        self._halted: list[asyncio.Task[None]] = []
        self._streams: set[SocketStream] = set()

    @property
    def running(self) -> bool:
        return self._run is not None

    def listen(self) -> None:
        """Listen (on the same port as before, if any) and serve in a background task."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        run = _Run(sock)
        run.task = asyncio.get_running_loop().create_task(self._serve(run))
        self._run = run

    async def _serve(self, run: _Run) -> None:
        listener = await anyio.abc.SocketListener.from_socket(run.sock)
        try:
            async with anyio.create_task_group() as tg:
                await listener.serve(self._connection, tg)
        except Exception:
            # halt() shuts the socket down: the pending accept fails (EINVAL), which ends the
            # serving and cancels the connections. (Cancelling the accept instead races with
            # its ready callback in asyncio: "InvalidStateError".)
            if not run.halted:
                log.exception("kubeapi_listener_failed", port=self.port)
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    def halt(self, *, reset: bool = False) -> None:
        """Refuse connections from now on and close every open one (with a TCP reset if ``reset``)."""
        run, self._run = self._run, None
        if run is None:
            return
        run.halted = True
        if reset:
            for stream in list(self._streams):
                _abort(stream)
        with contextlib.suppress(OSError):
            run.sock.shutdown(socket.SHUT_RDWR)
        if run.task is not None:
            self._halted.append(run.task)

    async def stop(self, *, reset: bool = False) -> None:
        """:meth:`halt`, then wait until every connection is closed. Safe to call twice."""
        self.halt(reset=reset)
        tasks, self._halted = self._halted, []
        if tasks:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(tasks)

    # -- one connection --------------------------------------------------------------------------

    async def _connection(self, stream: SocketStream) -> None:
        self._streams.add(stream)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _receive_request(conn, stream)
                if request is None or self._run is None:  # closed, or the server is going away
                    return
                response = await self.app(request)
                if isinstance(response, StreamResponse):
                    await _send_stream(conn, stream, response)
                else:
                    await _send(conn, stream, response)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (_Closed, h11.ProtocolError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return
        except Exception:  # one connection's failure must not end the others
            log.exception("kubeapi_connection_failed", port=self.port)
        finally:
            self._streams.discard(stream)
            with anyio.CancelScope(shield=True):
                await stream.aclose()


def _abort(stream: SocketStream) -> None:
    # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
    try:
        raw = stream.extra(SocketAttribute.raw_socket)  # noqa: S610 - anyio, not Django
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (OSError, anyio.TypedAttributeLookupError):
        pass


async def _receive_request(conn: h11.Connection, stream: SocketStream) -> Request | None:
    start: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_RECEIVE)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                data = b""
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            start = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                await _send(conn, stream, _too_large())
                raise _Closed
        elif isinstance(event, h11.EndOfMessage) and start is not None:
            target = urlsplit(start.target.decode("latin-1"))
            return Request(
                method=start.method.decode("ascii"),
                path=unquote(target.path),
                query=dict(parse_qsl(target.query, keep_blank_values=True)),
                headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.headers},
                body=bytes(body),
            )
        elif isinstance(event, h11.ConnectionClosed):
            return None
        else:
            raise _Closed


def _too_large() -> Response:
    message = f"Request entity too large: limit is {MAX_BODY}"
    body = (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        f'"message":"{message}","reason":"RequestEntityTooLarge","code":413}}'
    )
    return Response(413, body.encode())


def _head(status: int, content_type: str, extra: list[tuple[str, str]]) -> h11.Response:
    cache = (
        []
        if any(k.lower() == "cache-control" for k, _ in extra)
        else [("Cache-Control", "no-cache, private")]
    )
    headers = [("Content-Type", content_type), *cache, *extra]
    try:
        reason = HTTPStatus(status).phrase  # "200 OK", as Go's net/http writes it
    except ValueError:
        reason = ""
    return h11.Response(status_code=status, headers=headers, reason=reason)


async def _send(conn: h11.Connection, stream: SocketStream, response: Response) -> None:
    extra = [*response.headers, ("Content-Length", str(len(response.body)))]
    data = conn.send(_head(response.status, response.content_type, extra))
    data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send(data)


async def _send_stream(conn: h11.Connection, stream: SocketStream, response: StreamResponse) -> None:
    """Send chunks until the source ends, or until the peer sends anything (it went away)."""
    await stream.send(conn.send(_head(200, response.content_type, [("Transfer-Encoding", "chunked")])) or b"")
    peer_gone = False
    async with anyio.create_task_group() as tg:

        async def watch_peer() -> None:
            nonlocal peer_gone
            with contextlib.suppress(
                anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
            ):
                await stream.receive(_RECEIVE)
            # A client does not send during a watch answer: data or EOF both mean it is done.
            peer_gone = True
            tg.cancel_scope.cancel()

        tg.start_soon(watch_peer)
        try:
            async for chunk in response.chunks:
                await stream.send(conn.send(h11.Data(data=chunk)) or b"")
            await stream.send(conn.send(h11.EndOfMessage()) or b"")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # The client went away while the watch was being sent (a driver that exits): inside
            # the task group this would otherwise surface as an exception group.
            peer_gone = True
        finally:
            with anyio.CancelScope(shield=True):
                await response.chunks.aclose()
        tg.cancel_scope.cancel()
    if peer_gone:
        raise _Closed
