"""``devplug kubelet``: a fake kubelet to try ``devplug run`` and ``devplug inspect`` against.

It keeps a :class:`~devplug.testing.FakeKubelet` serving on ``--dir`` (and the plugin watcher
on ``--watcher-dir``) until Ctrl-C or SIGTERM, and prints what a kubelet's device manager
learns as it happens: registrations (accepted or refused, with the kubelet's text), each
resource's device table, health changes and streams that end. On the way out ``kubelet.sock``
is removed; the plugins' sockets are theirs to remove.

With ``--dra --kubelet-root ROOT`` it is a DRA kubelet with its API server instead
(:mod:`devplug.cli.kubelet.dra`).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from devplug._text import os_error_text
from devplug.logging import configure as configure_logging

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from devplug.testing import FakeKubelet, Registration

Row = tuple[str, str, tuple[int, ...]]
"""One device as the kubelet holds it: ID, health, NUMA nodes."""
Table = tuple[str, bool, tuple[Row, ...]]
"""One resource: the endpoint dialled, whether its stream is open, its devices."""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``kubelet`` sub-command to ``sub`` (argparse's sub-parsers) and return its parser."""
    from pathlib import Path

    parser: argparse.ArgumentParser = sub.add_parser(
        "kubelet",
        help="run a fake kubelet that plugins register with, printing what it learns",
        usage=(
            "devplug kubelet [-h] (--dir DIR [--watcher-dir DIR] | --dra --kubelet-root ROOT "
            "[--node-name NAME]) [--version]\n"
            "       devplug kubelet claim --kubelet-root ROOT [--driver DRIVER] [--device DEVICE ...] NAME\n"
            "       devplug kubelet claim --kubelet-root ROOT --delete NAME"
        ),
        description=(
            "Serve a fake kubelet (devplug.testing.FakeKubelet) on DIR/kubelet.sock until Ctrl-C, "
            "printing registrations, device tables and health changes as they happen. Try "
            "'devplug run MODULE:CLASS --device-plugin-dir DIR' and 'devplug inspect DIR/SOCKET' "
            "next to it. With --dra, a fake API server too, and the kubelet's DRA manager under "
            "ROOT: it prints the command that starts a DRA driver against them, then "
            "registrations, published pools, taints and health as they happen; it allocates and "
            "prepares the claims in its API server ('devplug kubelet claim', or kubectl apply "
            "with its kubeconfig). Restarted on the same ROOT, it keeps the API server's address."
        ),
    )
    parser.add_argument("--dir", type=Path, metavar="DIR", help="the device-plugin directory to serve")
    parser.add_argument(
        "--watcher-dir",
        type=Path,
        metavar="DIR",
        help="also run the plugin watcher on this plugins_registry directory",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="be a DRA kubelet with its API server (needs --kubelet-root instead of --dir)",
    )
    parser.add_argument(
        "--kubelet-root",
        type=Path,
        metavar="ROOT",
        help="--dra: the kubelet's root; device-plugins/, plugins_registry/ and plugins/ are under it",
    )
    parser.add_argument(
        "--node-name",
        default="node-1",
        metavar="NAME",
        help="--dra: the node the API server holds and the drivers publish for (default: node-1)",
    )
    from devplug.cli.kubelet import claim

    actions = parser.add_subparsers(dest="action", title="with a running --dra", metavar="claim")
    claim_parser = claim.add_parser(actions)
    claim_parser.set_defaults(claim_parser=claim_parser)  # for its one-line errors
    return parser


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """One line (exit 2) for flags that do not go together."""
    if args.dra:
        if args.kubelet_root is None:
            parser.error("--dra needs --kubelet-root ROOT (plugins_registry/ and plugins/ are under it)")
        given = [flag for flag, value in (("--dir", args.dir), ("--watcher-dir", args.watcher_dir)) if value]
        if given:
            parser.error(
                f"{' and '.join(given)} cannot go with --dra: it serves ROOT/device-plugins and "
                "ROOT/plugins_registry"
            )
        from devplug._names import is_dns_subdomain

        if not is_dns_subdomain(args.node_name):
            parser.error(f"--node-name {args.node_name!r}: a node name is a lowercase DNS subdomain")
        return
    if args.kubelet_root is not None or args.node_name != "node-1":
        parser.error("--kubelet-root and --node-name go with --dra")
    if args.dir is None:
        parser.error("the following arguments are required: --dir (or --dra --kubelet-root ROOT)")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Serve until SIGINT / SIGTERM; 0 then, 2 for a directory that cannot be used."""
    # The testing kit (and its API server's client library) loads for this command only, not
    # for every `devplug` command that builds the parser.
    from devplug.testing import FakeKubelet

    if args.action == "claim":
        from devplug.cli.kubelet import claim

        if args.dir or args.watcher_dir or args.dra:
            parser.error("'claim' goes alone: devplug kubelet claim --kubelet-root ROOT NAME")
        return claim.main(args, args.claim_parser)
    _check(args, parser)
    # The kit logs through structlog at info: keep its lines off the terminal's report.
    configure_logging("console", "warning")
    if args.dra:
        return _main_dra(args, parser)
    try:
        kubelet = FakeKubelet(args.dir, plugins_registry_dir=args.watcher_dir)
    except ValueError as exc:  # a socket path over the 107 bytes AF_UNIX allows
        parser.error(str(exc))
    return _guarded(kubelet, lambda: _run(lambda: _serve(kubelet, sys.stdout)))


def _guarded(kubelet: FakeKubelet, serve: Callable[[], int]) -> int:
    """``serve()`` while holding the lock of the kubelet's directory; 2 (one line) when another
    kubelet serves it."""
    from devplug.cli.kubelet.guard import DirectoryLock, Taken

    lock = DirectoryLock(kubelet.socket_path.parent)
    try:
        lock.acquire()
    except Taken as exc:
        print(f"devplug kubelet: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"devplug kubelet: {os_error_text(exc)}", file=sys.stderr)
        return 2
    try:
        return serve()
    finally:
        lock.release()


def _main_dra(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from devplug.cli.kubelet.dra import serve_dra
    from devplug.cli.kubelet.guard import port_free, previous_port
    from devplug.testing import FakeKubeAPI, FakeKubelet

    root = args.kubelet_root.absolute()
    kubeconfig = root / "kubeconfig"
    # The address of the last run on ROOT, if it is free: drivers started against that run
    # read its kubeconfig once, and reach this API server at the same address.
    last = previous_port(kubeconfig)
    port = last if last and port_free(last) else 0
    api = FakeKubeAPI(port=port)
    try:
        kubelet = FakeKubelet(
            root / "device-plugins",
            plugins_registry_dir=root / "plugins_registry",
            dra=True,
            kube_api=api,
            node_name=args.node_name,
        )
    except ValueError as exc:  # a socket path over the 107 bytes AF_UNIX allows
        parser.error(str(exc))
    return _guarded(
        kubelet,
        lambda: _run(
            lambda: serve_dra(
                api, kubelet, root, kubeconfig, sys.stdout, follow_devices=follow, last_port=last
            )
        ),
    )


def _run(serving: Callable[[], Awaitable[None]]) -> int:
    """Run ``serving()`` until it returns (a stop signal ends its serving): 0, 2 for an OSError;
    a stop signal before it serves raises Interrupted (status 130, one line)."""
    from devplug._runtime.signals import run_async

    try:
        run_async(serving)
    except KeyboardInterrupt:  # main called without devplug's handler installed
        print("devplug kubelet: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"devplug kubelet: {os_error_text(exc)}", file=sys.stderr)
        return 2
    return 0


async def _serve(kubelet: FakeKubelet, out: TextIO) -> None:
    from devplug._runtime.signals import until_signalled

    async with kubelet:
        _say(out, f"kubelet serving {kubelet.socket_path}")
        if kubelet.plugins_registry_dir is not None:
            _say(out, f"plugin watcher on {kubelet.plugins_registry_dir}")
        _say(out, "Ctrl-C to stop")
        await until_signalled(partial(follow, kubelet, out))
    _say(out, f"stopped; {kubelet.socket_path.name} removed")


async def follow(kubelet: FakeKubelet, out: TextIO) -> None:
    """Print every change of ``kubelet``'s registrations and device tables, for ever."""
    seen = 0
    tables: dict[str, Table] = {}
    while True:

        def changed(seen: int = seen, tables: dict[str, Table] = tables) -> dict[str, Table] | None:
            # A resource whose new endpoint has not listed yet keeps its last table, so that
            # the replacement is told when the new list comes.
            now = tables | _tables(kubelet)
            return now if len(kubelet.registrations) != seen or now != tables else None

        now = await kubelet.wait_for(changed)
        for registration in kubelet.registrations[seen:]:
            _say(out, registration_line(registration, kubelet.device_plugin_dir))
        seen = len(kubelet.registrations)
        for name, table in sorted(now.items()):
            for line in table_lines(name, tables.get(name), table):
                _say(out, line)
        tables = now


def _tables(kubelet: FakeKubelet) -> dict[str, Table]:
    return {
        name: (
            view.endpoint,
            view.connected,
            tuple((d.id, d.health.value, tuple(d.numa_nodes)) for d in view.devices),
        )
        for name, view in kubelet.resources.items()
        if view.messages or not view.connected
    }


def registration_line(registration: Registration, directory: Path) -> str:
    """One registration attempt as a line: the resource, its socket and options, or the refusal."""
    endpoint = registration.endpoint.removeprefix(f"{directory}/")
    if not registration.accepted:
        return f"refused {registration.resource or endpoint}: {registration.error}"
    options = [
        name
        for name, on in (
            ("preferred-allocation", registration.options.get_preferred_allocation_available),
            ("pre-start", registration.options.pre_start_required),
        )
        if on
    ]
    via = " (plugin watcher)" if registration.via == "watcher" else ""
    return f"registered {registration.resource}{via} on {endpoint}; options: {', '.join(options) or 'none'}"


def table_lines(name: str, before: Table | None, after: Table) -> list[str]:
    """What changed in one resource, as lines to print (none when nothing did)."""
    endpoint, connected, rows = after
    if before is not None and before[1] and not connected:
        return [f"{name}: stream ended; its devices are unhealthy until it registers again"]
    replaced = []
    if before is not None and before[0] != endpoint and before[1]:
        # The same resource registered from another socket: the kubelet closed the old one's stream.
        old_name, new_name = (path.rpartition("/")[2] for path in (before[0], endpoint))
        replaced = [f"{name}: {old_name} replaced by {new_name}; its stream closed"]
    old_rows = before[2] if before is not None and before[0] == endpoint else None
    if old_rows is not None and [r[0] for r in old_rows] == [r[0] for r in rows]:
        return [
            f"{name}: {new[0]} {old[1]} -> {new[1]}"
            for old, new in zip(old_rows, rows, strict=True)
            if old[1] != new[1]
        ]
    if old_rows == rows:
        return replaced
    healthy = sum(r[1] == "Healthy" for r in rows)
    lines = [*replaced, f"{name}: {len(rows)} device{'s' if len(rows) != 1 else ''}, {healthy} healthy"]
    width = max((len(r[0]) for r in rows), default=0)
    for device_id, health, numa in rows:
        where = f"  numa {','.join(map(str, numa))}" if numa else ""
        lines.append(f"  {device_id:<{width}}  {health}{where}")
    return lines


def _say(out: TextIO, line: str) -> None:
    print(line, file=out, flush=True)
