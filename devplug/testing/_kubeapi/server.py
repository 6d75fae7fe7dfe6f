"""FakeKubeAPI: a Kubernetes API server for tests of DRA drivers, over real HTTP/1.1 on localhost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from devplug.testing._kubeapi import openapi
from devplug.testing._kubeapi.faults import Fault, RecordedRequest
from devplug.testing._kubeapi.helpers import KubeAPIHelpers
from devplug.testing._kubeapi.httpserver import HTTPServer, Request, Response, StreamResponse
from devplug.testing._kubeapi.resources import KINDS, discovery
from devplug.testing._kubeapi.routes import (
    Route,
    dispatch,
    error_response,
    json_response,
    not_found_path,
    route,
)
from devplug.testing._kubeapi.status import APIError
from devplug.testing._kubeapi.store import Store
from devplug.testing._kubeapi.strategy import Gates

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

    import lightkube

log = structlog.get_logger(__name__)


class FakeKubeAPI(KubeAPIHelpers):
    """A Kubernetes API server for DRA drivers, over real HTTP/1.1 on 127.0.0.1 (h11, anyio).

    It serves ``resource.k8s.io/v1`` ResourceSlices (get, list, watch, create, update, patch,
    delete, deletecollection) and ResourceClaims (the same, plus ``status``; lists across
    namespaces), core ``v1`` Nodes, ``/version``, ``/api``, ``/apis`` discovery and the OpenAPI v3
    documents of those kinds (``/openapi/v3``). Objects are
    JSON dicts with a UID, one global resourceVersion counter, creationTimestamp and generation;
    errors are ``Status`` objects with the API server's reasons and texts. ResourceSlices are
    validated as the API server does (schema, limits, immutable fields: 422 with the field
    paths). Watches replay a bounded history from a resourceVersion (410 Expired beyond it).
    Test helpers act on the store directly: nodes, claims, allocation as the scheduler would,
    the kubelet's wipe; fault injection: :meth:`outage`, :meth:`fail`, :meth:`slow`.

    Use it as an async context manager (or ``start()``/``stop()``), on anyio's asyncio backend;
    :meth:`client` or :meth:`write_kubeconfig` connect lightkube or any client to :attr:`url`.

    kubectl works against it (``kubectl --kubeconfig`` with :meth:`write_kubeconfig`): ``get``
    (the API server's Tables, ``-o wide``, ``-w``, label and field selectors), ``describe``,
    client-side ``apply`` (strict field validation; a strategic merge patch follows the patch
    strategies of the kinds' OpenAPI schemas), ``patch``, ``label``, ``delete`` and ``explain``.

    Unknown fields: a request without ``fieldValidation`` (lightkube sends none) gets the API
    server's default, ``Warn``: the fields are dropped and named in ``Warning`` headers;
    ``fieldValidation=Strict`` rejects them with 400 BadRequest (``strict decoding error``; a
    PATCH that leaves some: 422 Invalid on the field ``patch``, as the API server answers), as
    does a value of the wrong JSON type or a capacity that is not a quantity (the server cannot
    decode those, so they are 400, not 422).

    Held against a real kube-apiserver 1.37 with etcd (tests/testing/kubeapi/real_api.py: the same
    tests run against both, found as envtest finds the binaries). Where it knowingly differs from
    a real API server: no authentication or authorization (all
    is allowed unless :meth:`fail` says otherwise); no admission (a Node created over HTTP gets
    no ``node.kubernetes.io/not-ready`` taint); no managedFields and no server-side apply
    (``application/apply-patch+yaml`` is 415 with a text that says so; kubectl reports "Server-side
    apply not available on the server"); the OpenAPI documents are the real server's without
    descriptions (``kubectl explain`` shows none), with only the served paths and JSON, and
    ``/openapi/v2`` has no paths (kubectl applying a kind not served says "no matches for
    kind"); the Tables' column descriptions are short texts of the fake's own; a strict
    PATCH that leaves unknown fields is 422 as on the real server, but the patched object quoted
    in its text has another field order; no Pods, Events or Leases, except an always empty
    ``/api/v1/pods`` list for ``kubectl describe node`` (which then says "Failed to get lease: the
    server could not find the requested resource"); deletion is immediate (finalizers and grace
    periods are not honoured; :meth:`delete_node` garbage-collects owned slices, nothing else does);
    quantities are stored as sent, not canonicalised; empty lists and maps are kept, not
    omitted; a continued list reads the current state, not the first page's snapshot; a watch
    from a future resourceVersion waits instead of failing; the 64-device limit's message is an
    approximation; only ResourceSlices, ResourceClaims and Nodes are served (no DeviceClasses,
    Pods but that empty list, or other kinds: 404); alpha fields other than list
    attributes and ``partitionTypeAttribute`` (dropped unless their gates are on) are kept;
    the ``spec.pool.name`` field selector (1.37) is served;
    ResourceClaims are validated for metadata, spec immutability and status rules only;
    :meth:`allocate_claim` evaluates no CEL selectors or device classes (it does honour taints,
    other claims' devices, shared counters and consumable capacity, as the scheduler does:
    devices with ``allowMultipleAllocations`` are shared, each share with a ``shareID`` and its
    ``consumedCapacity``, within the devices' capacities and ``requestPolicy``). The
    feature gates are options, at a default 1.37 cluster's values: DRADeviceTaints
    ``device_taints``, DRAPartitionableDevices ``partitionable_devices``, DRAConsumableCapacity
    ``consumable_capacity`` (its fields validated as the API server does: ``requestPolicy`` only
    with ``allowMultipleAllocations``, its ``validValues`` or ``validRange`` with a valid
    ``default``), DRADeviceBindingConditions ``binding_conditions``, all on;
    DRAPartitionableDevicesType ``partitionable_devices_type``, DRAListTypeAttributes
    ``list_type_attributes`` and DRAFractionalCapacityRange off.

    Attributes:
        requests: every answered request as a :class:`RecordedRequest`.
        user: the user named in injected 403 texts.
        bookmark_interval: seconds between BOOKMARK events of a quiet watch that asked for them.
    """

    kubernetes_version = "v1.37.0"

    def __init__(
        self,
        *,
        device_taints: bool = True,
        partitionable_devices: bool = True,
        consumable_capacity: bool = True,
        binding_conditions: bool = True,
        partitionable_devices_type: bool = False,
        list_type_attributes: bool = False,
        event_history: int = 1000,
        user: str = "system:serviceaccount:kube-system:dra-driver",
        port: int = 0,
    ) -> None:
        """Prepare a server; nothing listens until ``start()``.

        Args:
            device_taints: the DRADeviceTaints feature gate; when off, device ``taints`` are
                silently dropped from written slices.
            partitionable_devices: the DRAPartitionableDevices feature gate (on by default from
                Kubernetes 1.36); when off, written slices silently lose ``sharedCounters`` and
                ``perDeviceNodeSelection``, and their devices ``consumesCounters``, ``nodeName``,
                ``nodeSelector`` and ``allNodes`` (an update keeps them where the stored slice
                uses one), before validation: a slice that named its nodes only through
                ``perDeviceNodeSelection`` is refused (422, no node selection), one that held
                only counter sets is stored empty.
            consumable_capacity: the DRAConsumableCapacity feature gate (on by default from
                1.36); when off, slices lose ``allowMultipleAllocations`` and ``requestPolicy``,
                claims their capacity requests, and status writes ``shareID`` and
                ``consumedCapacity``.
            binding_conditions: the DRADeviceBindingConditions feature gate (on by default from
                1.36); when off, devices lose ``bindingConditions``,
                ``bindingFailureConditions`` and ``bindsToNode``.
            partitionable_devices_type: the DRAPartitionableDevicesType feature gate (alpha in
                1.37, off by default); when off, slices lose ``partitionTypeAttribute``.
            list_type_attributes: the DRAListTypeAttributes feature gate (alpha in 1.36 and
                1.37, off by default); when off, attributes lose their list values (and an
                attribute left without a value is refused).
            event_history: how many writes a watch can replay (older resourceVersions: 410).
            user: the user named in injected 403 answers.
            port: the port of 127.0.0.1 to listen on; 0 (the default) takes a free one. A
                fixed port lets a server started again keep the address its clients know.
        """
        super().__init__()
        self._store = Store(
            KINDS,
            history=event_history,
            gates=Gates(
                device_taints=device_taints,
                partitionable_devices=partitionable_devices,
                consumable_capacity=consumable_capacity,
                binding_conditions=binding_conditions,
                partitionable_devices_type=partitionable_devices_type,
                list_type_attributes=list_type_attributes,
            ),
        )
        self._server = HTTPServer(self._handle)
        self._server.port = port
        self._started = False
        self._delay = 0.0
        self._faults: list[Fault] = []
        self.requests: list[RecordedRequest] = []
        self.user = user
        self.bookmark_interval = 60.0

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeKubeAPI:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Listen on 127.0.0.1: the port given, else a free one (the same port again after :meth:`stop`).

        Raises:
            OSError: the port given is taken.
        """
        if self._server.running:
            raise RuntimeError("FakeKubeAPI is already running")
        self._server.listen()
        self._started = True
        log.info("kubeapi_started", url=self.url)

    async def stop(self) -> None:
        """Stop serving and close every connection. Safe to call twice."""
        running = self._server.running
        await self._server.stop()
        if running:
            log.info("kubeapi_stopped", url=self.url)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if not self._started:
            raise RuntimeError("FakeKubeAPI has not been started")
        return f"http://127.0.0.1:{self._server.port}"

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig for :attr:`url`: a cluster, a user without credentials, the context ``fake``."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}
            ],
            "current-context": "fake",
        }

    def write_kubeconfig(self, path: Path | str) -> Path:
        """Write :meth:`kubeconfig` to ``path`` (for ``KubeConfig.from_file`` or ``KUBECONFIG``)."""
        target = Path(path)
        target.write_text(json.dumps(self.kubeconfig(), indent=2) + "\n")  # JSON is YAML
        return target

    def client(self, **kwargs: Any) -> lightkube.AsyncClient:
        """A lightkube AsyncClient for this server (keyword arguments go to ``AsyncClient``).

        Built from :meth:`kubeconfig`: lightkube refuses ``KubeConfig.from_server(url)`` alone
        ("Missing user") when it makes the HTTP client. Needs the ``dra`` extra (lightkube).

        Raises:
            MissingExtraError: lightkube is not installed.
        """
        from devplug._extras import require

        require("dra", "FakeKubeAPI.client")
        import lightkube

        kwargs.setdefault("trust_env", False)  # no proxies from the environment for 127.0.0.1
        return lightkube.AsyncClient(lightkube.KubeConfig.from_dict(self.kubeconfig()), **kwargs)

    # -- fault injection -------------------------------------------------------------------------

    def outage(self) -> None:
        """Go away at once: connections are refused from now on, open ones are reset.

        The objects stay (as in etcd); :meth:`restore` brings the server back.
        """
        self._server.halt(reset=True)
        log.info("kubeapi_outage", port=self._server.port)

    def restore(self) -> None:
        """Come back after :meth:`outage`, on the same port, with the same objects."""
        if not self._server.running:
            self._server.listen()
            self._started = True
            log.info("kubeapi_restored", url=self.url)

    def fail(
        self,
        status: int = 403,
        verbs: Iterable[str] | None = ("create",),
        resource: str | None = "resourceslices",
        times: int | None = None,
        *,
        name: str | None = None,
        message: str | None = None,
    ) -> Fault:
        """Answer matching requests with ``status`` instead of serving them; returns the fault to cancel.

        ``verbs`` are Kubernetes verbs (None: any); ``resource`` is a plural, with
        ``/status`` for the subresource (None: any); ``name`` limits it to one object; ``times``
        how many answers (None: until cancelled). 403 gets the RBAC authorizer's text for
        :attr:`user`; other statuses the API server's reason and ``message`` (or a default).
        """
        fault = Fault(status, tuple(verbs) if verbs is not None else None, resource, name, message, times)
        self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        """Cancel every injected failure."""
        self._faults.clear()

    def slow(self, seconds: float) -> None:
        """Delay every answer by ``seconds`` (0 to stop)."""
        self._delay = seconds

    def compact(self) -> None:
        """Forget the watch history: a watch from any earlier resourceVersion gets 410 Expired."""
        self._store.compact()

    # -- serving ---------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response | StreamResponse:
        verb = request.method.lower()
        response: Response | StreamResponse
        try:
            if self._delay > 0:
                await anyio.sleep(self._delay)
            r = route(request)
            if r is None:
                response = self._other(request)
            else:
                verb = r.verb
                self._inject(r)
                response = await dispatch(self._store, request, r, bookmark_interval=self.bookmark_interval)
        except APIError as exc:
            response = error_response(exc)
        except Exception as exc:  # a bug here must not take the server down: answer as the API server would
            log.exception("kubeapi_request_failed", verb=verb, path=request.path)
            response = error_response(APIError(500, "InternalError", f"Internal error occurred: {exc}"))
        status = response.status if isinstance(response, Response) else 200
        self.requests.append(RecordedRequest(verb, request.path, status))
        log.debug("request", verb=verb, path=request.path, status=status)
        return response

    def _inject(self, r: Route) -> None:
        for fault in self._faults:
            if fault.matches(r):
                raise fault.error(r, self.user)

    def _other(self, request: Request) -> Response:
        if request.path in ("/healthz", "/livez", "/readyz"):
            return Response(200, b"ok", content_type="text/plain; charset=utf-8")
        path = request.path.rstrip("/") or "/"
        if request.method == "GET" and (path == openapi.PREFIX or path.startswith(openapi.PREFIX + "/")):
            answer = openapi.answer(path, request.query)
            if answer is None:
                raise not_found_path()
            return answer
        if request.method == "GET" and path == openapi.V2:
            return openapi.answer_v2(self.kubernetes_version)
        if request.method == "GET" and path == "/api/v1/pods" and request.query.get("watch") is None:
            # No pods run here; kubectl describe node lists a node's pods, and stops at a 404.
            meta = {"resourceVersion": str(self._store.rv)}
            return json_response(200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": []})
        document = discovery(path, self.kubernetes_version)
        if document is None or request.method != "GET":
            raise not_found_path()
        return json_response(200, document)


__all__ = ["FakeKubeAPI"]
