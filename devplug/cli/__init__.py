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
import re
import sys
from typing import NoReturn

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


_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _split_run(args: list[str]) -> tuple[str, list[str]]:
    """The MODULE:CLASS target and the runner options around it, in any order.

    ``devplug run --api dra mod:Class`` and ``devplug run mod:Class --api dra`` are the same:
    the target is the first argument shaped like one (an option's value such as ``:8080`` is
    not).
    """
    for index, arg in enumerate(args):
        if _TARGET.fullmatch(arg):
            return arg, args[:index] + args[index + 1 :]
    # A word that is not an option's value (``--api dra``) was meant as the target.
    wrong = next(
        (a for i, a in enumerate(args) if not a.startswith("-") and not (i and _takes_value(args[i - 1]))),
        None,
    )
    _fail(
        f"expected MODULE:CLASS, got {wrong!r}"
        if wrong
        else "the following arguments are required: MODULE:CLASS"
    )


def _takes_value(arg: str) -> bool:
    return arg.startswith("--") and "=" not in arg


def _cmd_run(target: str, rest: list[str]) -> int:
    from devplug._main import run
    from devplug.plugin import DevicePlugin

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
    # Imported here, not at the top: the console script's import stays small (the library,
    # pydantic and grpc load once a command runs).
    from devplug.cli import _conformance, _inspect
    from devplug.settings import _OneLineParser

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
    demo_parser = sub.add_parser(
        "demo",
        help="watch a fake kubelet and a fake plugin talk: registration, allocation, health, restart",
    )
    demo_parser.add_argument(
        "--dra",
        action="store_true",
        help="the same plugin as a DRA driver: slices published, a claim prepared, a wipe restored",
    )
    inspect_parser = _inspect.add_parser(sub)
    conformance_parser = _conformance.add_parser(sub)
    if args[:1] == ["run"]:
        return _cmd_run(*_split_run(args[1:]))
    known, rest = parser.parse_known_args(args)
    if known.command == "conformance":
        # Everything after the options is the plugin's command line, its own flags included.
        return _conformance.main(known, conformance_parser)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if known.command == "demo":
        from devplug.cli import _demo

        return _demo.main(dra=known.dra)
    if known.command == "inspect":
        return _inspect.main(known, inspect_parser)
    parser.error(f"unknown command {known.command}")
    return 2  # pragma: no cover - parser.error exits


if __name__ == "__main__":
    sys.exit(main())
