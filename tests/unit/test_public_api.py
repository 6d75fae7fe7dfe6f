from __future__ import annotations

import inspect

import pytest

import devplug


def test_all_is_exact() -> None:
    assert len(set(devplug.__all__)) == len(devplug.__all__)
    for name in devplug.__all__:
        assert hasattr(devplug, name), name
    public = {n for n in vars(devplug) if not n.startswith("_") and not inspect.ismodule(getattr(devplug, n))}
    assert public - {"annotations"} <= set(devplug.__all__)


def test_no_protobuf_in_public_signatures() -> None:
    for name in devplug.__all__:
        obj = getattr(devplug, name)
        targets = [obj]
        if inspect.isclass(obj):
            targets += [m for _, m in inspect.getmembers(obj, inspect.isfunction)]
        for target in targets:
            if callable(target):
                try:
                    text = str(inspect.signature(target))
                except (TypeError, ValueError):
                    continue
                assert "pb2" not in text and "_proto" not in text, (name, text)


DRA_ONLY = ("CounterConsumption", "CounterSet", "DeviceTaint")


def test_dra_only_models_are_exported_from_devplug_dra() -> None:
    import devplug.dra
    import devplug.models

    assert len(set(devplug.dra.__all__)) == len(devplug.dra.__all__)
    for name in devplug.dra.__all__:
        assert hasattr(devplug.dra, name), name
    claims = {
        "AllocatedDevice",
        "CdiSpecFile",
        "Claim",
        "ClaimRef",
        "OpaqueConfig",
        "PreparedDevice",
        "ResourceClaimDict",
    }
    assert {*DRA_ONLY, *claims} <= set(devplug.dra.__all__)
    assert not {*DRA_ONLY, *claims} & set(devplug.__all__)
    for name in {*DRA_ONLY, *claims}:
        assert getattr(devplug.dra, name) is getattr(devplug.models, name), name


@pytest.mark.parametrize("name", DRA_ONLY)
def test_a_moved_name_is_still_given_with_a_warning(name: str) -> None:
    import devplug.dra

    with pytest.warns(DeprecationWarning, match=f"devplug.{name} is deprecated: import it from devplug.dra"):
        value = getattr(devplug, name)
    assert value is getattr(devplug.dra, name)
    with pytest.warns(DeprecationWarning, match=name) as caught:
        exec(f"from devplug import {name}", {})  # noqa: S102 - the import statement a user writes
    assert caught[0].filename == "<string>"  # the importing line, not importlib's
    assert name not in vars(devplug) and name not in dir(devplug)  # __all__ stays exact
