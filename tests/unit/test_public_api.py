from __future__ import annotations

import inspect

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
