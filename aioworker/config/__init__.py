"""Worker configuration: frozen msgspec Structs loaded from TOML plus command-line overrides.

Unknown keys are rejected so a typo fails at start-up, naming the key. A module a group of
sections: engine.py (what the engine computes), device.py (how a device computes it),
service.py (how the ranks run and are reached), and worker.py (the whole, the checks across
sections, and `load_config`)."""

from aioworker.config.device import DeviceOptions
from aioworker.config.engine import (
    CacheOptions,
    GuidedOptions,
    ModelOptions,
    ParallelOptions,
    SchedulerOptions,
    SpeculativeOptions,
)
from aioworker.config.section import ConfigError
from aioworker.config.service import ApiOptions, LauncherOptions, RuntimeOptions, SecurityOptions
from aioworker.config.worker import WorkerConfig, load_config

__all__ = [
    "ApiOptions",
    "CacheOptions",
    "ConfigError",
    "DeviceOptions",
    "GuidedOptions",
    "LauncherOptions",
    "ModelOptions",
    "ParallelOptions",
    "RuntimeOptions",
    "SchedulerOptions",
    "SecurityOptions",
    "SpeculativeOptions",
    "WorkerConfig",
    "load_config",
]
