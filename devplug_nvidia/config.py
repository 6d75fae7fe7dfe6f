"""The NVIDIA plugin's settings: upstream's flags, environment variables and config file.

:class:`NvidiaSettings` subclasses :class:`devplug.Settings`, so the runner options
(``--device-plugin-dir``, ``--log-level``, ``DEVPLUG_*``, devplug's own ``--config``) keep working,
and adds every option of NVIDIA's device plugin under upstream's flag names. Upstream's
environment variables are unprefixed (``MIG_STRATEGY``, ``NVIDIA_DRIVER_ROOT``, ``KUBELET_SOCKET``);
an extra settings source reads them, ranked just below the command line.

Precedence, as upstream: an explicit flag or environment variable > the ``--config-file`` value >
the default. Cross-field rules (MPS needs ``--mps-root``, MPS and ``mixed`` exclude each other)
are checked on the merged result. Every error is a one-line :class:`devplug.ConfigError`.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import field_validator, model_validator
from pydantic_settings import BaseSettings, CliSuppress, PydanticBaseSettingsSource

from devplug.errors import ConfigError
from devplug.settings import Settings, load_settings
from devplug_nvidia._config._feature_gates import CONSUMABLE_SHARES, FeatureGateError, parse_feature_gates
from devplug_nvidia._config._file import (
    ConfigFileV1,
    DeviceListStrategy,
    HealthConfig,
    ImexConfig,
    Resources,
    Sharing,
    read_config_file,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pydantic.fields import FieldInfo

__all__ = [
    "CDI_STRATEGIES",
    "DRA_ENV_NAMES",
    "ENV_NAMES",
    "ConsumableShares",
    "NvidiaSettings",
    "load_nvidia_settings",
]

CDI_STRATEGIES = frozenset({"cdi-annotations", "cdi-cri"})
_GO_INT = re.compile(r"[+-]?[0-9]+")

ConsumableShares = Literal["memory", "unlimited"] | int
"""A ``--consumable-shares`` mode that shares devices: ``memory``, ``unlimited`` or N shares."""

ENV_NAMES: dict[str, tuple[str, ...]] = {
    "mig_strategy": ("MIG_STRATEGY",),
    "fail_on_init_error": ("FAIL_ON_INIT_ERROR",),
    "driver_root": ("NVIDIA_DRIVER_ROOT",),
    "dev_root": ("NVIDIA_DEV_ROOT",),
    "pass_device_specs": ("PASS_DEVICE_SPECS",),
    "device_list_strategy": ("DEVICE_LIST_STRATEGY",),
    "device_id_strategy": ("DEVICE_ID_STRATEGY",),
    "gdrcopy_enabled": ("GDRCOPY_ENABLED",),
    "gds_enabled": ("GDS_ENABLED",),
    "mofed_enabled": ("MOFED_ENABLED",),
    "kubelet_socket": ("KUBELET_SOCKET",),
    "config_file": ("CONFIG_FILE",),
    "cdi_annotation_prefix": ("CDI_ANNOTATION_PREFIX",),
    "nvidia_cdi_hook_path": ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
    "driver_root_ctr_path": ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
    "mps_root": ("MPS_ROOT",),
    "device_discovery_strategy": ("DEVICE_DISCOVERY_STRATEGY",),
    "imex_channel_ids": ("IMEX_CHANNEL_IDS",),
    "imex_required": ("IMEX_REQUIRED",),
    "cdi_feature_flags": ("CDI_FEATURE_FLAGS",),
    "shared_devices_allocation_policy": ("SHARED_DEVICES_ALLOCATION_POLICY",),
    "fake_nvml": ("DEVPLUG_FAKE_NVML",),
}
"""Field → upstream's environment variables (first found wins)."""
DRA_ENV_NAMES: dict[str, tuple[str, ...]] = {
    "cdi_dir": ("CDI_ROOT",),
    "plugins_registry_dir": ("KUBELET_REGISTRAR_DIRECTORY_PATH",),
    "feature_gates": ("FEATURE_GATES",),
    "additional_xids_to_ignore": ("ADDITIONAL_XIDS_TO_IGNORE",),
    "consumable_shares": ("CONSUMABLE_SHARES",),
    "host_root": ("HOST_ROOT",),
    "metrics_address": ("HTTP_ENDPOINT",),
    "metrics_path": ("METRICS_PATH",),
    "service_account_name": ("SERVICE_ACCOUNT_NAME",),
    "image_pull_secrets": ("IMAGE_PULL_SECRETS",),
    "image_pull_policy": ("IMAGE_PULL_POLICY",),
}
"""Field → the environment variables of NVIDIA's DRA driver (gpu-kubelet-plugin) for settings
devplug has too, read like :data:`ENV_NAMES` (for ``--api dra``)."""

_LIST_FIELDS = frozenset({"device_list_strategy", "imex_channel_ids", "cdi_feature_flags"})

# Upstream's flag aliases, rewritten to the canonical flag before parsing.
_FLAG_ALIASES = {
    "--nvidia-driver-root": "--driver-root",
    "--nvidia-dev-root": "--dev-root",
    "--nvidia-ctk-path": "--nvidia-cdi-hook-path",
    "--container-driver-root": "--driver-root-ctr-path",
    # NVIDIA's DRA driver's flags where devplug has the same setting.
    "--cdi-root": "--cdi-dir",
    "--kubelet-registrar-directory-path": "--plugins-registry-dir",
    "--http-endpoint": "--metrics-address",
}

# Config-file field → settings field ("plugin." marks flags.plugin.*).
_FILE_FLAGS = {
    "mig_strategy": "mig_strategy",
    "fail_on_init_error": "fail_on_init_error",
    "mps_root": "mps_root",
    "nvidia_driver_root": "driver_root",
    "nvidia_dev_root": "dev_root",
    "gdrcopy_enabled": "gdrcopy_enabled",
    "gds_enabled": "gds_enabled",
    "mofed_enabled": "mofed_enabled",
    "device_discovery_strategy": "device_discovery_strategy",
}
_FILE_PLUGIN_FLAGS = {
    "pass_device_specs": "pass_device_specs",
    "device_list_strategy": "device_list_strategy",
    "device_id_strategy": "device_id_strategy",
    "cdi_annotation_prefix": "cdi_annotation_prefix",
    "nvidia_ctk_path": "nvidia_cdi_hook_path",
    "container_driver_root": "driver_root_ctr_path",
    "kubelet_socket": "kubelet_socket",
    "cdi_feature_flags": "cdi_feature_flags",
    "shared_devices_allocation_policy": "shared_devices_allocation_policy",
}


class _UpstreamEnv(PydanticBaseSettingsSource):
    """NVIDIA's unprefixed environment variables (``MIG_STRATEGY=mixed``)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        for env in (*ENV_NAMES.get(field_name, ()), *DRA_ENV_NAMES.get(field_name, ())):
            if env in os.environ:
                return os.environ[env], env, False
        return None, "", False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in self.settings_cls.model_fields:
            raw, _, _ = self.get_field_value(self.settings_cls.model_fields[name], name)
            if raw is None:
                continue
            # Upstream's slice flags read comma lists from the environment.
            values[name] = [v.strip() for v in raw.split(",") if v.strip()] if name in _LIST_FIELDS else raw
        return values


class NvidiaSettings(Settings):
    """NVIDIA device plugin for Kubernetes (flags, environment and config file as NVIDIA's)."""

    mig_strategy: Literal["none", "single", "mixed"] = "none"
    """How MIG devices are advertised: none, single or mixed (MIG_STRATEGY; flags.migStrategy)."""
    fail_on_init_error: bool = True
    """Exit when NVML cannot start; false: stay up and advertise nothing (FAIL_ON_INIT_ERROR)."""
    driver_root: str = "/"
    """Root of the NVIDIA driver installation on the host (NVIDIA_DRIVER_ROOT; alias --nvidia-driver-root)."""
    dev_root: str | None = None
    """Root of the NVIDIA device nodes on the host; default: the driver root (NVIDIA_DEV_ROOT)."""
    pass_device_specs: bool = False
    """Pass the device nodes to the kubelet in Allocate (PASS_DEVICE_SPECS)."""
    device_list_strategy: tuple[DeviceListStrategy, ...] = ("envvar",)
    """How the device list reaches the runtime: envvar, volume-mounts, cdi-annotations, cdi-cri;
    a comma list or repeated (DEVICE_LIST_STRATEGY)."""
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    """Device IDs passed to the runtime: uuid or index (DEVICE_ID_STRATEGY)."""
    gdrcopy_enabled: bool = False
    """Start containers with GDRCopy support: NVIDIA_GDRCOPY=enabled (GDRCOPY_ENABLED)."""
    gds_enabled: bool = False
    """Start containers with GPUDirect Storage support: NVIDIA_GDS=enabled (GDS_ENABLED)."""
    mofed_enabled: bool = False
    """Start containers with MOFED support: NVIDIA_MOFED=enabled (MOFED_ENABLED)."""
    config_file: Path | None = None
    """NVIDIA's config file (v1, YAML or JSON); flags and environment variables override it (CONFIG_FILE)."""
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    """Prefix of the CDI annotation keys (CDI_ANNOTATION_PREFIX)."""
    nvidia_cdi_hook_path: str = "/usr/bin/nvidia-ctk"
    """The NVIDIA CDI hook in generated CDI specs (NVIDIA_CDI_HOOK_PATH; alias --nvidia-ctk-path)."""
    driver_root_ctr_path: str = "/driver-root"
    """Where the driver root is mounted in this container, for CDI specs (DRIVER_ROOT_CTR_PATH)."""
    mps_root: str | None = None
    """Host path of the MPS control daemon's files; required with sharing.mps (MPS_ROOT)."""
    device_discovery_strategy: Literal["auto", "nvml", "tegra"] = "auto"
    """How devices are found: auto, nvml or tegra (DEVICE_DISCOVERY_STRATEGY)."""
    imex_channel_ids: tuple[int, ...] = ()
    """IMEX channels to inject: none or 0 (IMEX_CHANNEL_IDS)."""
    imex_required: bool = False
    """The IMEX channels must exist at start-up (IMEX_REQUIRED)."""
    cdi_feature_flags: tuple[str, ...] = ()
    """Feature flags for CDI spec generation (CDI_FEATURE_FLAGS)."""
    shared_devices_allocation_policy: Literal["distributed", "packed"] = "distributed"
    """Preferred allocation of shared replicas: distributed or packed (SHARED_DEVICES_ALLOCATION_POLICY)."""
    fake_nvml: str | None = None
    """Run on the fake NVML machine model of this name (testing; DEVPLUG_FAKE_NVML)."""
    feature_gates: str = ""
    """NVIDIA's DRA feature gates, Name=true,Other=false: TimeSlicingSettings, MPSSupport,
    DynamicMIG, NVMLDeviceHealthCheck, ConsumableShares, FabricManagerPartitioning, ... (NVIDIA's
    names and defaults; FEATURE_GATES)."""
    additional_xids_to_ignore: str = ""
    """For --api dra: a comma list of XIDs to treat like the ignored 13, 31, 43, 45, 68 and 109,
    so that they taint their device with effect None, not NoSchedule; empty: none
    (ADDITIONAL_XIDS_TO_IGNORE). With --api device-plugin, DP_DISABLE_HEALTHCHECKS does that."""
    consumable_shares: str = "disabled"
    """For --api dra: GPUs and MIG devices shared by several claims (consumable capacity):
    disabled, memory (a claim takes all the memory unless it asks for less), unlimited (a claim
    takes none unless it asks), or a positive integer N (also N shares, a claim takes one);
    needs the ConsumableShares feature gate (CONSUMABLE_SHARES)."""
    metrics_path: str = "/metrics"
    """For --api dra: where NVIDIA's driver serves its metrics; /metrics is the only path served
    here, and empty turns the metrics server (--metrics-address, alias --http-endpoint) off
    (METRICS_PATH)."""
    service_account_name: str = ""
    """For --api dra: the service account of NVIDIA's MPS control-daemon Deployments; only empty
    is accepted, the MPS daemons run in this pod (SERVICE_ACCOUNT_NAME)."""
    image_pull_secrets: str = ""
    """For --api dra: the image pull secrets of NVIDIA's MPS control-daemon Deployments; only
    empty is accepted (IMAGE_PULL_SECRETS)."""
    image_pull_policy: str = ""
    """For --api dra: the image pull policy of NVIDIA's MPS control-daemon Deployments; only
    empty is accepted (IMAGE_PULL_POLICY)."""

    sharing: CliSuppress[Sharing] = Sharing()
    """sharing.timeSlicing / sharing.mps of the config file."""
    resources: CliSuppress[Resources | None] = None
    """resources.gpus / resources.mig naming patterns of the config file."""
    health_config: CliSuppress[HealthConfig | None] = None
    """The config file's health section (event types, ignored / critical XIDs)."""

    @classmethod
    def environment_names(cls, field: str) -> tuple[str, ...]:
        """Upstream's variables first (they beat DEVPLUG_*), then devplug's."""
        upstream = (*ENV_NAMES.get(field, ()), *DRA_ENV_NAMES.get(field, ()))
        return (*upstream, *super().environment_names(field))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The command line arrives as init arguments; upstream's names beat DEVPLUG_*.
        return init_settings, _UpstreamEnv(settings_cls), env_settings, dotenv_settings, file_secret_settings

    @field_validator("device_list_strategy", "cdi_feature_flags", "imex_channel_ids", mode="before")
    @classmethod
    def _comma_lists(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list | tuple):
            parts = [p for v in value for p in (v.split(",") if isinstance(v, str) else [v])]
            return [p.strip() if isinstance(p, str) else p for p in parts if p != ""]
        return value

    @field_validator("device_list_strategy")
    @classmethod
    def _some_strategy(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one device list strategy is needed")
        return tuple(dict.fromkeys(value))

    @field_validator("imex_channel_ids")
    @classmethod
    def _imex_ids(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if value not in ((), (0,)):
            raise ValueError(f"IMEX channel IDs must be empty or [0], got {list(value)}")
        return value

    @field_validator("feature_gates")
    @classmethod
    def _known_gates(cls, value: str) -> str:
        try:
            parse_feature_gates(value)
        except FeatureGateError as exc:
            # One line as NVIDIA's flag parser words it; a ConfigError is not wrapped by pydantic.
            raise ConfigError(f'invalid value "{value}" for flag --feature-gates: {exc}') from None
        return value

    @field_validator("additional_xids_to_ignore")
    @classmethod
    def _unsigned_xids(cls, value: str) -> str:
        # NVIDIA skips an item that is not an unsigned integer (logged at debug level only); a
        # typo would then leave that XID counted without a word, so it is refused here.
        for raw in value.split(","):
            item = raw.strip()
            if item and not (item.isdigit() and item.isascii()):
                raise ConfigError(
                    f'invalid value "{value}" for flag --additional-xids-to-ignore: '
                    f'"{item}" is not an XID (an unsigned integer)'
                )
        return value

    @field_validator("metrics_address", mode="before")
    @classmethod
    def _empty_endpoint(cls, value: Any) -> Any:
        # NVIDIA's HTTP_ENDPOINT="" (its default) means no metrics server.
        return None if value == "" else value

    @model_validator(mode="before")
    @classmethod
    def _no_metrics_path(cls, data: Any) -> Any:
        # NVIDIA's driver serves no metrics with an empty path, whatever the endpoint.
        if isinstance(data, dict) and data.get("metrics_path") == "":
            return {**data, "metrics_address": None}
        return data

    @model_validator(mode="before")
    @classmethod
    def _merge_config_file(cls, data: Any) -> Any:
        """Fill in what no flag or environment variable set from ``--config-file``."""
        if not isinstance(data, dict) or not data.get("config_file"):
            return data
        parsed = read_config_file(Path(data["config_file"]))  # raises ConfigError, not ValueError
        return {**_file_values(parsed), **data}

    @model_validator(mode="after")
    def _cross_checks(self) -> NvidiaSettings:
        _check_consumable_shares(self.consumable_shares, self.gates)
        if self.sharing.strategy == "mps":
            if self.mig_strategy == "mixed":
                raise ConfigError("using --mig-strategy=mixed is not supported with MPS (sharing.mps)")
            if not self.mps_root:
                raise ConfigError("using MPS (sharing.mps) requires --mps-root (MPS_ROOT, flags.mpsRoot)")
        return self

    @property
    def effective_dev_root(self) -> str:
        """Where device nodes live on the host: ``dev_root``, else the driver root."""
        return self.dev_root or self.driver_root

    def host_dev_path(self, path: str) -> str:
        """``/dev/nvidia0`` → its host path under the dev root."""
        return posixpath.join(self.effective_dev_root, path.lstrip("/"))

    @property
    def gates(self) -> Mapping[str, bool]:
        """Every feature gate NVIDIA's DRA driver knows → enabled (a read-only mapping)."""
        return parse_feature_gates(self.feature_gates)

    def gate_enabled(self, name: str) -> bool:
        """Whether feature gate ``name`` (e.g. ``"MPSSupport"``) is on.

        Raises:
            KeyError: not a gate NVIDIA's DRA driver knows.
        """
        return self.gates[name]

    @property
    def shares(self) -> ConsumableShares | None:
        """What ``--consumable-shares`` publishes (None: devices are not shared): NVIDIA's
        ``isConsumableSharesEnabled``, the gate on and a mode other than ``disabled``."""
        if not self.gates[CONSUMABLE_SHARES] or self.consumable_shares.strip() in ("", "disabled"):
            return None
        mode = self.consumable_shares.strip()
        if mode == "memory":
            return "memory"
        if mode == "unlimited":
            return "unlimited"
        return int(mode)

    @property
    def cdi_only(self) -> bool:
        """Only CDI device-list strategies are selected."""
        return set(self.device_list_strategy) <= CDI_STRATEGIES

    @property
    def any_cdi(self) -> bool:
        return bool(set(self.device_list_strategy) & CDI_STRATEGIES)


def _check_consumable_shares(value: str, gates: Mapping[str, bool]) -> None:
    """NVIDIA's ``validateCLIFlags`` for ``--consumable-shares``: the gate first, then the value
    (``disabled``, ``memory``, ``unlimited`` or a positive integer as Go's ``strconv.Atoi`` reads
    it: an optional sign, decimal digits, nothing else).

    Raises:
        ConfigError: NVIDIA's words, after its ``invalid CLI flags:``.
    """
    if value == "disabled":
        return
    if not gates[CONSUMABLE_SHARES]:
        raise ConfigError(
            f"invalid CLI flags: --consumable-shares requires feature gate {CONSUMABLE_SHARES} to be enabled"
        )
    if value in ("memory", "unlimited"):
        return
    if not (_GO_INT.fullmatch(value) and 0 < int(value) < 2**63):
        raise ConfigError(
            f'invalid CLI flags: invalid value for --consumable-shares: "{value}" '
            "(must be 'disabled', 'memory', 'unlimited', or a positive integer)"
        )


def _file_values(parsed: ConfigFileV1) -> dict[str, Any]:
    values: dict[str, Any] = {"sharing": parsed.sharing}
    if parsed.resources is not None:
        values["resources"] = parsed.resources
    if parsed.health is not None:
        values["health_config"] = parsed.health
    flags = parsed.flags
    for src, dst in _FILE_FLAGS.items():
        if (value := getattr(flags, src)) is not None:
            values[dst] = value
    if flags.plugin is not None:
        for src, dst in _FILE_PLUGIN_FLAGS.items():
            if (value := getattr(flags.plugin, src)) is not None:
                values[dst] = value
    imex: ImexConfig = parsed.imex
    if imex.channel_ids:
        values["imex_channel_ids"] = imex.channel_ids
    if imex.required:
        values["imex_required"] = True
    return values


def _normalise_argv(argv: list[str]) -> list[str]:
    """Upstream's spellings → ours: flag aliases, and ``--bool-flag=true|false``."""
    bools = {
        "--" + name.replace("_", "-")
        for name, info in NvidiaSettings.model_fields.items()
        if info.annotation is bool
    }
    out: list[str] = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        flag = _FLAG_ALIASES.get(flag, flag)
        if eq and flag in bools and value.lower() in ("true", "1", "t", "false", "0", "f"):
            out.append(flag if value.lower() in ("true", "1", "t") else "--no-" + flag[2:])
        else:
            out.append(flag + eq + value)
    return out


def load_nvidia_settings(argv: list[str] | None = None, *, prog: str = "devplug-nvidia") -> NvidiaSettings:
    """Parse ``argv`` (default ``sys.argv[1:]``), the environment and the config files.

    Raises:
        ConfigError: an invalid value, file or combination (one line naming the key).
    """
    import sys

    args = _normalise_argv(sys.argv[1:] if argv is None else list(argv))
    return load_settings(NvidiaSettings, args, prog=prog)
