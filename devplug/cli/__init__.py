"""The ``devplug`` command: ``run``, ``demo``, ``inspect`` and ``conformance``.

What belongs here is the command line only: argument parsing, the sub-commands and what they
print (``_demo``, ``_inspect`` with its client and renderer, ``_conformance``, the shared
``_argtypes``). Nothing in the library imports this package: only ``devplug.__main__``
(``python -m devplug``), the ``devplug`` console script (``devplug.cli:main``), the tests and
the bench do. Work a library user could want belongs in the library; the commands use it like
any other program.
"""

from __future__ import annotations

import importlib
import sys
from typing import NoReturn

from devplug._main import run
from devplug.cli import _conformance, _inspect
from devplug.plugin import DevicePlugin
from devplug.settings import _OneLineParser

__all__ = ["main"]


def _fail(message: str) -> NoReturn:
    print(f"devplug run: {message}", file=sys.stderr)
    raise SystemExit(2)


def _load(target: str) -> object:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        _fail(f"expected MODULE:CLASS, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name}: {exc}")
    try:
        obj: object = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        _fail(f"{module_name} has no attribute {attr}")
    return obj


def _cmd_run(target: str, rest: list[str]) -> int:
    obj = _load(target)
    prog = f"devplug run {target}"
    if isinstance(obj, type) and issubclass(obj, DevicePlugin):
        # The class says which settings it takes and how it is built from them.
        return run(obj.from_settings, settings_cls=obj.settings_class, argv=rest, prog=prog)
    if isinstance(obj, DevicePlugin):
        return run(obj, argv=rest, prog=prog)
    _fail(f"{target} is not a DevicePlugin subclass or instance")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``devplug`` console script."""
    args = sys.argv[1:] if argv is None else argv
    # One line and status 2 for a bad argument, in every sub-command (sub-parsers share the class).
    parser = _OneLineParser(prog="devplug", description="Kubernetes device plugins in async Python.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_parser = sub.add_parser(
        "run",
        help="serve a DevicePlugin class (MODULE:CLASS) to the kubelet",
        description="Serve MODULE:CLASS with the standard runner options (see --help after the target).",
        add_help=False,
    )
    run_parser.add_argument("target", metavar="MODULE:CLASS")
    sub.add_parser(
        "demo",
        help="watch a fake kubelet and a fake plugin talk: registration, allocation, health, restart",
    )
    inspect_parser = _inspect.add_parser(sub)
    conformance_parser = _conformance.add_parser(sub)
    known, rest = parser.parse_known_args(args)
    if known.command == "run":
        return _cmd_run(known.target, rest)
    if known.command == "conformance":
        # Everything after the options is the plugin's command line, its own flags included.
        return _conformance.main(known, conformance_parser)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if known.command == "demo":
        from devplug.cli import _demo

        return _demo.main()
    if known.command == "inspect":
        return _inspect.main(known, inspect_parser)
    parser.error(f"unknown command {known.command}")
    return 2  # pragma: no cover - parser.error exits


if __name__ == "__main__":
    sys.exit(main())
