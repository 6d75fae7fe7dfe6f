"""The real local node of e2e/node, for the end-to-end tests: kubectl, pods, plugin processes.

Synchronous on purpose: every step talks to real processes (kubectl, the kubelet, containerd,
devplug's commands) and waits for what they report, each wait with a deadline of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e"))
import localnode  # noqa: E402  (e2e/ is not a package: the node script runs before devplug is installed)

T = TypeVar("T")
VENV_BIN = Path(sys.executable).parent


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60, every: float = 0.25) -> T:
    """Poll `probe` until it returns something truthy, and return that; fail naming `what` (and
    the last error). tests.support.wait_until, synchronous: the same failure, for a kubectl that
    may fail on the way."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except (subprocess.CalledProcessError, KeyError, ValueError, OSError) as exc:
            value, last = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f" (last error: {last})" if last else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(every)


@dataclass
class Node:
    """A node started by `e2e/node up` in `run` (its export line parsed into `env`)."""

    run: Path
    env: dict[str, str]
    version: str = localnode.DEFAULT_K8S

    @property
    def minor(self) -> int:
        """The Kubernetes minor release the node runs (37 for v1.37.2)."""
        return int(self.version.split(".")[1])

    @property
    def name(self) -> str:
        return self.env["NODE_NAME"]

    @property
    def kubelet_root(self) -> Path:
        return Path(self.env["KUBELET_ROOT"])

    @property
    def cdi_dir(self) -> Path:
        return Path(self.env["CDI_DIR"])

    @property
    def kubeconfig(self) -> str:
        return self.env["KUBECONFIG"]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        cmd = [
            str(localnode.k8s_dir(self.version) / "bin" / "kubectl"),
            "--kubeconfig",
            self.kubeconfig,
            *args,
        ]
        env = dict(os.environ, KUBECACHEDIR=str(self.run / "kubectl-cache"))
        res = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False, env=env
        )
        if check and res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
        return res.stdout

    def get(self, kind: str, name: str = "", namespace: str = "default") -> Any:
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        return json.loads(self.kubectl(*args))

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        )

    def delete(self, kind: str, name: str, namespace: str = "default", wait: bool = True) -> None:
        self.kubectl(
            "delete",
            kind,
            name,
            "-n",
            namespace,
            "--ignore-not-found",
            f"--wait={str(wait).lower()}",
            "--timeout=60s",
        )

    def allocatable(self, resource: str) -> int:
        return int(
            self.get("node", self.name, namespace="")["status"].get("allocatable", {}).get(resource, 0)
        )

    def capacity(self, resource: str) -> int:
        return int(self.get("node", self.name, namespace="")["status"].get("capacity", {}).get(resource, 0))

    def wait_allocatable(self, resource: str, count: int, timeout: float = 60) -> None:
        wait_for(
            f"{resource} allocatable = {count} on {self.name}",
            lambda: self.allocatable(resource) == count,
            timeout,
        )

    def dra_flags(self) -> list[str]:
        """What a DRA driver on this node is told: kubelet root, CDI directory, node, kubeconfig."""
        return [
            "--api",
            "dra",
            "--kubelet-root",
            str(self.kubelet_root),
            "--cdi-dir",
            str(self.cdi_dir),
            "--node-name",
            self.name,
            "--kubeconfig",
            self.kubeconfig,
        ]

    def restart(self, component: str, how: signal.Signals = signal.SIGTERM) -> None:
        localnode.restart(self.run, component, how)

    def wait_ready(self, timeout: float = 120) -> None:
        def ready() -> bool:
            conditions = self.get("node", self.name, namespace="")["status"]["conditions"]
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for(f"node {self.name} Ready", ready, timeout)

    # ---- pods

    def run_pod(
        self,
        name: str,
        *,
        resources: dict[str, int] | None = None,
        claims: Sequence[dict[str, Any]] = (),
        command: str = "env; ls -ln /dev; sleep 3600",
        timeout: float = 90,
        wait: bool = True,
    ) -> dict[str, Any]:
        """Create a busybox pod (host network, no registry) and wait until it runs (unless not
        ``wait``); returns the pod."""
        container: dict[str, Any] = {
            "name": "main",
            "image": localnode.BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", command],
        }
        if resources:
            container["resources"] = {"limits": {k: str(v) for k, v in resources.items()}}
        if claims:
            container.setdefault("resources", {})["claims"] = [{"name": c["name"]} for c in claims]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "hostNetwork": True,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [container],
                "resourceClaims": list(claims),
            },
        }
        if not claims:
            del pod["spec"]["resourceClaims"]
        self.apply(pod)
        return self.wait_running(name, timeout) if wait else self.get("pod", name)

    def wait_running(self, name: str, timeout: float = 90) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            pod = self.get("pod", name)
            phase = pod["status"].get("phase")
            if phase in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {name} ended ({phase}): {json.dumps(pod['status'])[:2000]}")
            return pod if phase == "Running" else None

        try:
            return wait_for(f"pod {name} Running", running, timeout)
        except AssertionError as exc:
            events = self.kubectl(
                "get", "events", "--field-selector", f"involvedObject.name={name}", check=False
            )
            raise AssertionError(f"{exc}\nevents:\n{events}") from None

    def logs(self, pod: str, marker: str = "") -> str:
        """The container's output, once it holds `marker` (its command prints, then sleeps)."""
        return wait_for(
            f"the output of pod {pod}",
            lambda: (out := self.kubectl("logs", pod)) and marker in out and out,
            timeout=30,
        )

    def pod_env(self, pod: str) -> dict[str, str]:
        out = self.logs(pod, "PATH=")
        return dict(
            line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith(" ")
        )

    def pods_on_node(self) -> list[dict[str, Any]]:
        return list(self.get("pods", namespace="default")["items"])


@contextmanager
def plugin_process(
    node: Node, tmp: Path, command: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A devplug command (devplug-fake, devplug-nvidia, devplug) as a process for the node."""
    log = tmp / f"{command}.log"
    exe = VENV_BIN / command
    full_env = dict(os.environ, KUBECONFIG=node.kubeconfig, NODE_NAME=node.name, **(env or {}))
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(exe), *args], stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    proc.log = log  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        stop_process(proc)


def noop_hook(tmp: Path) -> Path:
    """The NVIDIA CDI hook named in devplug-nvidia's specs: on a machine without NVIDIA's toolkit,
    a no-op, so that containerd can run the hooks the spec lists."""
    hook = tmp / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return hook


def stop_process(proc: subprocess.Popen[bytes], how: signal.Signals = signal.SIGTERM) -> int:
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, how)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode


def log_of(proc: subprocess.Popen[bytes]) -> str:
    return Path(proc.log).read_text(errors="replace")  # type: ignore[attr-defined]


def events(proc: subprocess.Popen[bytes], name: str) -> int:
    """How many times the process logged the event `name` (its JSON log)."""
    return sum(1 for line in log_of(proc).splitlines() if f'"event": "{name}"' in line)


def wait_streaming(proc: subprocess.Popen[bytes], count: int = 1, timeout: float = 60) -> None:
    """Until the kubelet opened its `count`-th ListAndWatch on the plugin: from then on the kubelet
    holds the devices' health, whatever the node's status (updated every 2 s) still says."""
    wait_for(
        f"ListAndWatch #{count} from the kubelet", lambda: events(proc, "stream_opened") >= count, timeout
    )


def device_nodes(listing: str) -> dict[str, tuple[int, int]]:
    """`ls -ln /dev` output -> {name: (major, minor)} for its character devices."""
    nodes = {}
    for line in listing.splitlines():
        parts = line.split()
        if line.startswith("c") and len(parts) >= 10:
            nodes[parts[-1]] = (int(parts[4].rstrip(",")), int(parts[5]))
    return nodes
