"""A small DRA driver as a program, for the DRA conformance tests: correct unless told otherwise.

Usage: python dra_script_driver.py --kubelet-root DIR --cdi-dir DIR [--driver NAME] [--fault F ...]

It reads NODE_NAME and KUBECONFIG as a DaemonSet pod would, publishes one slice of two devices
through the API server (plain HTTP), recreates it when it disappears, prepares claims from their
allocation with one CDI spec per claim, serves v1alpha1 health, and on SIGTERM removes its
sockets and exits 0. Each ``--fault`` breaks one of those on purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import grpc

from devplug._proto.dra.v1 import api_pb2 as v1
from devplug._proto.dra.v1 import api_pb2_grpc as v1_grpc
from devplug._proto.dra.v1beta1 import api_pb2 as v1beta1
from devplug._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug._proto.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug._proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug._proto.pluginregistration.v1 import api_pb2 as reg_pb
from devplug._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

FAULTS = {
    "reg-first": "create the registration socket before serving the DRA socket",
    "v1beta1-first": "list v1beta1.DRAPlugin before v1.DRAPlugin",
    "no-owner": "publish slices without the Node owner reference",
    "no-restore": "never recreate deleted slices",
    "skip-entry": "answer NodePrepareResources without the claims' entries",
    "bare-cdi": "answer CDI IDs that are not fully qualified",
    "no-respec": "never rewrite a CDI spec that was deleted",
    "partial-health": "list one device only in health messages",
    "exit-1": "exit with status 1 on SIGTERM",
    "leave-socket": "leave the registration socket behind on SIGTERM",
}
DEVICES = ("dev-0", "dev-1")
KIND = "example.com/gpu"


class Api:
    def __init__(self) -> None:
        config = json.loads(Path(os.environ["KUBECONFIG"]).read_text())
        self.url = config["clusters"][0]["cluster"]["server"]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310 - http only
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - a test's own URL
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.faults, self.name = args, set(args.fault), args.driver
        self.node = os.environ["NODE_NAME"]
        self.api = Api()
        root = Path(args.kubelet_root)
        self.dra_socket = root / "plugins" / self.name / "dra.sock"
        self.reg_socket = root / "plugins_registry" / f"{self.name}-reg.sock"
        self.cdi_dir = Path(args.cdi_dir)
        self.prepared: dict[str, Any] = {}
        self.written: set[str] = set()

    # -- slices ----------------------------------------------------------------------------------

    def publish(self) -> None:
        selector = f"spec.nodeName={self.node},spec.driver={self.name}"
        listed = self.api.call("GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}")
        if listed["items"]:
            return
        node = self.api.call("GET", f"/api/v1/nodes/{self.node}")
        meta: dict[str, Any] = {"generateName": f"{self.node}-{self.name}-"}
        if "no-owner" not in self.faults:
            owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node["metadata"]["uid"]}
            meta["ownerReferences"] = [{**owner, "controller": True}]
        spec = {
            "driver": self.name,
            "nodeName": self.node,
            "pool": {"name": self.node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in DEVICES],
        }
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta, "spec": spec}
        self.api.call("POST", "/apis/resource.k8s.io/v1/resourceslices", body)

    async def keep_slices(self) -> None:
        while True:
            await anyio.to_thread.run_sync(self.publish)
            if "no-restore" in self.faults:
                return
            await anyio.sleep(0.1)

    # -- claims ----------------------------------------------------------------------------------

    def prepare_one(self, pb: Any, claim: Any) -> Any:
        entry = pb.NodePrepareResourceResponse()
        if claim.uid in self.prepared:
            devices = self.prepared[claim.uid]
        else:
            path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
            found = self.api.call("GET", path)
            if found is None or found["metadata"]["uid"] != claim.uid:
                entry.error = f"claim {claim.namespace}/{claim.name} not found"
                return entry
            results = found["status"]["allocation"]["devices"]["results"]
            devices = [(r["request"], r["pool"], r["device"]) for r in results if r["driver"] == self.name]
            self.prepared[claim.uid] = devices
        spec = self.cdi_dir / f"example.com-gpu_{claim.uid}.json"
        if not spec.exists() and ("no-respec" not in self.faults or claim.uid not in self.written):
            self.written.add(claim.uid)
            cdi = [
                {"name": f"{claim.uid}-{d}", "containerEdits": {"env": [f"DEV={d}"]}} for _, _, d in devices
            ]
            spec.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": KIND, "devices": cdi}))
        for request, pool, device in devices:
            qualified = (
                f"{claim.uid}-{device}" if "bare-cdi" in self.faults else f"{KIND}={claim.uid}-{device}"
            )
            entry.devices.add(
                request_names=[request], pool_name=pool, device_name=device, cdi_device_ids=[qualified]
            )
        return entry


class Dra:
    def __init__(self, driver: Driver, pb: Any) -> None:
        self.d, self.pb = driver, pb

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = self.pb.NodePrepareResourcesResponse()
        if "skip-entry" in self.d.faults:
            return response
        for claim in request.claims:
            entry = await anyio.to_thread.run_sync(self.d.prepare_one, self.pb, claim)
            response.claims[claim.uid].CopyFrom(entry)
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self.d.prepared.pop(claim.uid, None)
            (self.d.cdi_dir / f"example.com-gpu_{claim.uid}.json").unlink(missing_ok=True)
            response.claims.get_or_create(claim.uid)
        return response


class Health:
    def __init__(self, driver: Driver) -> None:
        self.d = driver

    async def NodeWatchResources(self, request: Any, context: Any) -> Any:
        listed = DEVICES[:1] if "partial-health" in self.d.faults else DEVICES
        while True:
            yield health_pb.NodeWatchResourcesResponse(
                devices=[
                    health_pb.DeviceHealth(
                        device=health_pb.DeviceIdentifier(pool_name=self.d.node, device_name=d),
                        health=health_pb.HEALTHY,
                    )
                    for d in listed
                ]
            )
            await anyio.sleep(1)


class Registration:
    def __init__(self, driver: Driver) -> None:
        self.d = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:
        services = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        if "v1beta1-first" in self.d.faults:
            services.reverse()
        return reg_pb.PluginInfo(
            type="DRAPlugin",
            name=self.d.name,
            endpoint=str(self.d.dra_socket),
            supported_versions=[*services, "v1alpha1.DRAResourceHealth"],
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return reg_pb.RegistrationStatusResponse()


async def serve(path: Path, *adders: Any) -> grpc.aio.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    server = grpc.aio.server()
    for add, servicer in adders:
        add(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubelet-root", required=True)
    parser.add_argument("--cdi-dir", required=True)
    parser.add_argument("--driver", default="script.example.com")
    parser.add_argument("--fault", action="append", default=[], choices=sorted(FAULTS))
    d = Driver(parser.parse_args())
    dra = [
        (v1_grpc.add_DRAPluginServicer_to_server, Dra(d, v1)),
        (v1beta1_grpc.add_DRAPluginServicer_to_server, Dra(d, v1beta1)),
        (health_grpc.add_DRAResourceHealthServicer_to_server, Health(d)),
    ]
    registration = [(reg_grpc.add_RegistrationServicer_to_server, Registration(d))]
    if "reg-first" in d.faults:
        servers = [await serve(d.reg_socket, *registration)]
        await anyio.sleep(1.5)
        servers.append(await serve(d.dra_socket, *dra))
    else:
        servers = [await serve(d.dra_socket, *dra), await serve(d.reg_socket, *registration)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.keep_slices)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        tg.cancel_scope.cancel()
    for server in servers:
        await server.stop(None)
    d.reg_socket.unlink(missing_ok=True)
    d.dra_socket.unlink(missing_ok=True)
    if "leave-socket" in d.faults:  # a stale socket file, as a driver killed mid-way leaves
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(str(d.reg_socket))
    return 1 if "exit-1" in d.faults else 0


if __name__ == "__main__":
    raise SystemExit(anyio.run(main))
