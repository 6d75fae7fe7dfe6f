"""``devplug kubelet claim``: a ResourceClaim prepared by a running ``devplug kubelet --dra``.

It creates the claim in the API server of the ``devplug kubelet --dra`` serving ``--kubelet-root``
(found through ``ROOT/kubeconfig``), and waits for that kubelet to allocate it as the scheduler
would and prepare it (:mod:`devplug.cli.kubelet.claims`), then prints its devices and their
CDI device IDs; ``--delete`` deletes it, and the kubelet unprepares it. The same claim applied
with ``kubectl apply`` is prepared the same way.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class _Failed(Exception):
    """The claim could not be made or prepared (status 1, the message as one line)."""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``claim`` to ``sub`` (the kubelet command's sub-parsers) and return its parser."""
    from pathlib import Path

    from devplug.cli._argtypes import positive_seconds, whole_number

    parser: argparse.ArgumentParser = sub.add_parser(
        "claim",
        prog="devplug kubelet claim",
        help="have a running 'devplug kubelet --dra' allocate and prepare a claim",
        description=(
            "Create the ResourceClaim NAME in the API server of the 'devplug kubelet --dra' serving "
            "ROOT; that kubelet allocates it on its node as the scheduler would (first fit, or the "
            "devices given) and prepares it with the driver (NodePrepareResources). Prints the "
            "devices and their CDI device IDs once prepared. --delete deletes the claim; the "
            "kubelet unprepares it."
        ),
    )
    parser.add_argument("name", metavar="NAME", help="the claim's name")
    parser.add_argument(
        "--kubelet-root",
        type=Path,
        metavar="ROOT",
        required=True,
        help="the root a running 'devplug kubelet --dra --kubelet-root ROOT' serves",
    )
    parser.add_argument(
        "--driver",
        metavar="DRIVER",
        help="the driver to allocate from (default: the only one publishing devices)",
    )
    parser.add_argument(
        "--device",
        action="append",
        metavar="DEVICE",
        help="a device to allocate, by its name in the driver's ResourceSlices (repeat for more)",
    )
    parser.add_argument(
        "--count", type=whole_number, metavar="N", help="how many devices the scheduler picks (default: 1)"
    )
    parser.add_argument(
        "--namespace", default="default", metavar="NS", help="the claim's namespace (default: default)"
    )
    parser.add_argument("--delete", action="store_true", help="delete the claim: the kubelet unprepares it")
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for the kubelet to prepare the claim (default: 30)",
    )
    return parser


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Create (or delete) the claim: 0 once prepared (deleted), 1 when it cannot be, 2 for bad flags."""
    from devplug._names import is_dns_subdomain

    for what, value in (("NAME", args.name), ("--namespace", args.namespace), ("--driver", args.driver)):
        if value is not None and not is_dns_subdomain(value):
            parser.error(f"{what} {value!r}: a lowercase DNS subdomain (a-z, 0-9, '-', '.')")
    if args.delete and (args.device or args.count is not None or args.driver):
        parser.error("--delete takes the claim's NAME only (no --driver, --device or --count)")
    if args.device and args.count is not None:
        parser.error("--device and --count cannot go together: the devices given are the count")
    if args.count is not None and args.count < 1:
        parser.error(f"--count {args.count}: at least 1")
    kubeconfig = args.kubelet_root.absolute() / "kubeconfig"
    try:
        url = _server(kubeconfig)
    except _Failed as exc:
        parser.error(str(exc))
    try:
        if args.delete:
            _delete(url, args.namespace, args.name)
            print(f"claim {args.namespace}/{args.name} deleted; the kubelet unprepares it")
            return 0
        driver = args.driver or _only_driver(url)
        _create(url, args, driver)
        for line in _wait(url, args.namespace, args.name, args.timeout):
            print(line)
    except _Failed as exc:
        print(f"devplug kubelet claim: {exc}", file=sys.stderr)
        return 1
    return 0


def _server(kubeconfig: Path) -> str:
    try:
        config = json.loads(kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])
    except FileNotFoundError:
        raise _Failed(
            f"{kubeconfig} not found: is 'devplug kubelet --dra --kubelet-root {kubeconfig.parent}' running?"
        ) from None
    except (OSError, ValueError, LookupError, TypeError) as exc:
        raise _Failed(f"{kubeconfig}: not a kubeconfig written by devplug kubelet --dra ({exc})") from None


def _call(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to the API server: the status and the decoded answer."""
    data = json.dumps(body).encode() if body is not None else None
    if not url.startswith(("http://", "https://")):
        raise _Failed(f"the kubeconfig's server {url!r} is not an http(s) URL")
    request = urllib.request.Request(url + path, data=data, method=method)  # noqa: S310 - http(s), checked
    request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: no proxy
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        raise _Failed(
            f"cannot reach the API server at {url} ({reason}): is devplug kubelet --dra running?"
        ) from None


def _only_driver(url: str) -> str:
    _, slices = _call(url, "GET", _SLICES)
    drivers = sorted({item["spec"]["driver"] for item in slices.get("items") or ()})
    if len(drivers) == 1:
        return str(drivers[0])
    if not drivers:
        raise _Failed("no driver publishes devices yet: start one (the kubelet's first lines say how)")
    raise _Failed(f"several drivers publish devices ({', '.join(drivers)}): choose one with --driver")


def _create(url: str, args: argparse.Namespace, driver: str) -> None:
    count = len(args.device) if args.device else args.count or 1
    metadata: dict[str, Any] = {"name": args.name, "namespace": args.namespace}
    if args.device:
        from devplug.cli.kubelet.claims import DEVICES

        metadata["annotations"] = {DEVICES: ",".join(args.device)}
    request = {
        "name": "devices",
        "exactly": {"deviceClassName": driver, "allocationMode": "ExactCount", "count": count},
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": [request]}},
    }
    status, answer = _call(url, "POST", _CLAIMS.format(namespace=args.namespace), body)
    if status == 409:
        raise _Failed(
            f"claim {args.namespace}/{args.name} exists: delete it first (devplug kubelet claim --delete)"
        )
    if status >= 300:
        raise _Failed(f"the API server refused the claim: {answer.get('message', status)}")


def _delete(url: str, namespace: str, name: str) -> None:
    status, answer = _call(url, "DELETE", f"{_CLAIMS.format(namespace=namespace)}/{name}")
    if status == 404:
        raise _Failed(f"no claim {namespace}/{name}")
    if status >= 300:
        raise _Failed(
            f"the API server refused to delete claim {namespace}/{name}: {answer.get('message', status)}"
        )


def _wait(url: str, namespace: str, name: str, timeout: float) -> list[str]:
    """The claim's lines once the kubelet has prepared it."""
    from devplug.cli.kubelet.claims import ERROR, PREPARED

    path = f"{_CLAIMS.format(namespace=namespace)}/{name}"
    deadline = time.monotonic() + timeout
    while True:
        status, claim = _call(url, "GET", path)
        if status == 404:
            raise _Failed(f"claim {namespace}/{name} was deleted before it was prepared")
        annotations = claim.get("metadata", {}).get("annotations") or {}
        if ERROR in annotations:
            raise _Failed(f"claim {namespace}/{name} {annotations[ERROR]}")
        if PREPARED in annotations:
            results = claim["status"]["allocation"]["devices"]["results"]
            devices = ", ".join(f"{r['driver']} {r['pool']}/{r['device']}" for r in results)
            ids = annotations[PREPARED].replace(",", ", ") or "none"
            return [f"claim {namespace}/{name} prepared: {devices}", f"CDI devices: {ids}"]
        if time.monotonic() > deadline:
            raise _Failed(
                f"claim {namespace}/{name} not prepared within {timeout:g} s: is devplug kubelet --dra "
                "running on this root?"
            )
        time.sleep(0.1)
