"""The fake kubelet's registration rules and texts (pure functions)."""

from __future__ import annotations

import pytest

from devplug.testing._kubelet.validation import (
    check_unix_path,
    go_quote,
    go_rpc_error,
    is_extended_resource_name,
    join_endpoint,
    validate_plugin_info,
    validate_register,
)

LONG_LABEL = "a" * 63


@pytest.mark.parametrize(
    "name",
    [
        "example.com/widget",
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.5gb",
        "vendor.example.com/Widget_2",
        "a/b",
        "x-1.y/A.b-c_d",
        f"example.com/{'w' * 63}",
        f"{'p' * (253 - len('requests.'))}/w",
        f"{LONG_LABEL}.{LONG_LABEL}/w",
        f"{'a' * 64}.com/w",  # the subdomain rule limits the whole prefix, not each label
    ],
)
def test_extended_resource_names(name: str) -> None:
    assert is_extended_resource_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "widget",  # no prefix: a native resource name
        "kubernetes.io/widget",  # the native namespace
        "foo.kubernetes.io/widget",  # contains it, which is enough
        "requests.example.com/widget",  # the quota prefix
        "Example.com/widget",  # prefixes are lower-case DNS subdomains
        "example_com/widget",
        "-example.com/widget",
        "example.com./widget",
        "example.com/",
        "/widget",
        "example.com/a/b",
        "example.com/-widget",
        "example.com/widget-",
        "example.com/wid get",
        "example.com/widget\n",  # no trailing newline sneaking past the pattern
        f"example.com/{'w' * 64}",  # name part over 63
        f"{'p' * (254 - len('requests.'))}/w",  # requests.<prefix> over 253
    ],
)
def test_not_extended_resource_names(name: str) -> None:
    assert not is_extended_resource_name(name)


@pytest.mark.parametrize(
    ("version", "resource", "error"),
    [
        ("v1beta1", "example.com/widget", None),
        (
            "v1alpha",
            "example.com/widget",
            'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]',
        ),
        (
            "",
            "not a name",  # the version is checked first
            'requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]',
        ),
        ("v1beta1", "widget", 'the ResourceName "widget" is invalid'),
        ("v1beta1", 'say "hi"/x', 'the ResourceName "say \\"hi\\"/x" is invalid'),
    ],
)
def test_validate_register(version: str, resource: str, error: str | None) -> None:
    assert validate_register(version, resource) == error


@pytest.mark.parametrize(
    ("name", "versions", "error"),
    [
        ("example.com/widget", ["v1beta1"], None),
        ("example.com/widget", ["v1alpha1", "v1beta1"], None),
        (
            "example.com/widget",
            ["v1alpha1", "v1"],
            "manager version, v1beta1, is not among plugin supported versions [v1alpha1 v1]",
        ),
        ("example.com/widget", [], "manager version, v1beta1, is not among plugin supported versions []"),
        ("widget", ["v1beta1"], 'invalid name of device plugin socket: the ResourceName "widget" is invalid'),
    ],
)
def test_validate_plugin_info(name: str, versions: list[str], error: str | None) -> None:
    assert validate_plugin_info(name, versions) == error


@pytest.mark.parametrize(
    ("text", "quoted"),
    [("v1", '"v1"'), ('a"b', '"a\\"b"'), ("a\\b", '"a\\\\b"'), ("tab\there", '"tab\\there"'),
     ("\x01", '"\\x01"'), ("é", '"é"'), ("\u00a0", '"\\u00a0"')],
)  # fmt: skip
def test_go_quote(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted


@pytest.mark.parametrize(
    ("endpoint", "path"),
    [
        ("widget.sock", "/dp/widget.sock"),
        ("/tmp/widget.sock", "/dp/tmp/widget.sock"),  # Go's Join does not let it escape
        ("../widget.sock", "/widget.sock"),
        ("./a//b.sock", "/dp/a/b.sock"),
        ("", "/dp"),
    ],
)
def test_join_endpoint_is_go_filepath_join(endpoint: str, path: str) -> None:
    assert join_endpoint("/dp", endpoint) == path


def test_check_unix_path() -> None:
    check_unix_path("/" + "a" * 106)
    with pytest.raises(ValueError, match="108 bytes"):
        check_unix_path("/" + "a" * 107)
    with pytest.raises(ValueError, match="108 bytes"):
        check_unix_path("/" + "é" * 53 + "a")  # bytes, not characters


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("DEADLINE_EXCEEDED", "rpc error: code = DeadlineExceeded desc = x"),
        ("CANCELLED", "rpc error: code = Canceled desc = x"),
        ("INTERNAL", "rpc error: code = Internal desc = x"),
        ("OK", "rpc error: code = OK desc = x"),
    ],
)
def test_go_rpc_error(code: str, text: str) -> None:
    assert go_rpc_error(code, "x") == text
