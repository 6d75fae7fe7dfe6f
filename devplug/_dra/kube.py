"""The API server, as the driver uses it: the only module that touches the client library.

lightkube's AsyncClient (typed resources, asyncio-native over httpx) underneath; objects cross
this module's boundary as plain JSON dicts, and every failure as :class:`KubeError` carrying the
HTTP status (None when the server could not be reached) and the server's message.

The claim read on every NodePrepareResources skips lightkube's typed model: a GET through the
httpx client lightkube holds (its base URL, TLS and credentials, so in-cluster tokens, exec
plugins and client certificates work as for every other call), checked by lightkube's own
status check, the body decoded straight to a dict. That client keeps an idle connection for
:data:`KEEP_ALIVE` seconds rather than httpx's 5: prepares come minutes apart on a node, and
a claim read on a new connection pays for a TLS handshake.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from devplug.errors import ConfigError, DevplugError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    import httpx2
    from lightkube import AsyncClient


KEEP_ALIVE = 60.0
"""Seconds an idle connection to the API server is kept for the next request. A claim read on a
new connection takes some 3-4 ms more (TCP and TLS handshakes; 3.7 ms reused against 7 ms new
here), so with httpx's 5 s nearly every prepare on a real node paid for one. Below the API
server's own idle timeout (90 s, which client-go's 90 s matches) so that it is the client that
lets a connection go; a connection the server closed is seen by httpx before it is reused."""


class KubeError(DevplugError):
    """An API request failed: ``status`` is the HTTP status, None when it never got an answer."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def status_label(self) -> str:
        """The status for logs and metrics: ``403``, or ``unreachable``."""
        return str(self.status) if self.status is not None else "unreachable"


def load_client(kubeconfig: Path | None) -> Kube:
    """A client for the API server of ``kubeconfig``, else the in-cluster service account, else
    $KUBECONFIG or ~/.kube/config.

    Raises:
        ConfigError: no usable configuration (one line saying which file and why).
    """
    import lightkube
    import yaml
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError

    try:
        if kubeconfig is not None:
            config = lightkube.KubeConfig.from_file(kubeconfig)
        else:
            config = lightkube.KubeConfig.from_env()
        client = lightkube.AsyncClient(config, field_manager="devplug")
    except (
        OSError,
        LightkubeConfigError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        yaml.YAMLError,
    ) as exc:
        where = (
            f"kubeconfig {kubeconfig}"
            if kubeconfig is not None
            else "no in-cluster service account and no kubeconfig"
        )
        detail = getattr(exc, "strerror", None) or str(exc).splitlines()[0] or type(exc).__name__
        if isinstance(exc, yaml.YAMLError | TypeError | AttributeError | KeyError):
            detail = f"not a kubeconfig file ({type(exc).__name__}: {detail})"
        hint = "" if kubeconfig is not None else " (pass --kubeconfig FILE)"
        raise ConfigError(f"{where}: {detail}{hint}") from None
    return Kube(client)


class Kube:
    """The calls a DRA driver makes, each raising :class:`KubeError`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._http = _http_client(client)
        if self._http is not None:
            _keep_alive(self._http, KEEP_ALIVE)

    async def aclose(self) -> None:
        await self._client.close()

    async def node_uid(self, node: str) -> str:
        from lightkube.resources.core_v1 import Node

        async with _errors():
            obj = await self._client.get(Node, node)
        uid = obj.metadata.uid if obj.metadata else None
        return uid or ""  # a missing UID is empty, never the text "None"

    async def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as the API server sent it (a quorum read, as the kubelet's helper makes it)."""
        http = self._http
        if http is None:  # a lightkube that keeps its httpx client elsewhere: the typed read
            from lightkube.resources.resource_v1 import ResourceClaim

            async with _errors():
                obj = await self._client.get(ResourceClaim, name, namespace=namespace)
            return _dict(obj)
        path = f"{_CLAIMS}/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"
        async with _errors():
            response = await http.send(http.build_request("GET", path))
            _raise_for_status(response)
        data: dict[str, Any] = json.loads(response.content)
        return data

    async def patch_claim_status(
        self, namespace: str, name: str, resource_version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge ``status`` into the claim's status, if the claim is still at
        ``resource_version`` (409 otherwise: someone wrote it meanwhile)."""
        from lightkube.resources.resource_v1 import ResourceClaim
        from lightkube.types import PatchType

        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        async with _errors():
            obj = await self._client.patch(
                ResourceClaim.Status, name, body, namespace=namespace, patch_type=PatchType.MERGE
            )
        return _dict(obj)

    async def list_claims(self) -> tuple[list[dict[str, Any]], str]:
        """Every ResourceClaim of the cluster, and the list's resourceVersion (to watch from)."""
        from lightkube.resources.resource_v1 import ResourceClaim

        async with _errors():
            listing = self._client.list(ResourceClaim, namespace="*")
            items = [_dict(obj) async for obj in listing]
            return items, listing.resourceVersion

    async def watch_claims(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, claim) of every namespace from ``resource_version`` on; ends (or raises)
        when the watch breaks."""
        from lightkube.resources.resource_v1 import ResourceClaim

        async with _errors():
            async for kind, obj in self._client.watch(
                ResourceClaim, namespace="*", resource_version=resource_version, server_timeout=300
            ):
                yield kind, _dict(obj)

    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        """The driver's slices of the node, and the list's resourceVersion (to watch from)."""
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            listing = self._client.list(ResourceSlice, fields={"spec.driver": driver, "spec.nodeName": node})
            items = [_dict(obj) async for obj in listing]
            return items, listing.resourceVersion

    async def watch_slices(
        self, driver: str, node: str, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from ``resource_version`` on; ends (or raises) when the watch breaks."""
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            async for kind, obj in self._client.watch(
                ResourceSlice,
                fields={"spec.driver": driver, "spec.nodeName": node},
                resource_version=resource_version,
                server_timeout=300,  # a broken watch raises: the caller lists again
            ):
                yield kind, _dict(obj)

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            return _dict(await self._client.create(ResourceSlice.from_dict(obj)))

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            return _dict(await self._client.replace(ResourceSlice.from_dict(obj)))

    async def delete_slice(self, name: str) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            await self._client.delete(ResourceSlice, name)


_CLAIMS = "apis/resource.k8s.io/v1/namespaces"  # relative: a server URL with a path keeps it


def _http_client(client: AsyncClient) -> httpx2.AsyncClient | None:
    """The authenticated httpx client inside lightkube's AsyncClient, None where it is not found."""
    import httpx2

    http = getattr(getattr(client, "_client", None), "_client", None)
    return http if isinstance(http, httpx2.AsyncClient) else None


def _keep_alive(http: httpx2.AsyncClient, seconds: float) -> None:
    """Keep ``http``'s idle connections ``seconds``. httpx takes this only when a client is made
    (lightkube makes it with the default), so it is set on the connection pool, before the first
    request; where the pool is not found, the default stays."""
    pool = getattr(getattr(http, "_transport", None), "_pool", None)
    if pool is not None and isinstance(getattr(pool, "_keepalive_expiry", None), int | float):
        pool._keepalive_expiry = seconds


def _raise_for_status(response: httpx2.Response) -> None:
    """lightkube's own check: an error answer with the server's Status raises ApiError, any other
    error answer httpx's HTTPStatusError, as lightkube's typed calls do."""
    from lightkube.core.generic_client import GenericClient

    GenericClient.raise_for_status(response)  # type: ignore[no-untyped-call]


def _dict(obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj.to_dict()
    return data


class _errors:
    """Turns the client library's failures into KubeError."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, KubeError):
            return
        import httpx2
        from lightkube import ApiError

        if isinstance(exc, ApiError):
            status = exc.status
            raise KubeError(status.message or str(exc), status.code, status.reason or "") from None
        if isinstance(exc, httpx2.HTTPError | OSError):
            raise KubeError(f"API server unreachable: {exc or type(exc).__name__}") from None
