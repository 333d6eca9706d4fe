"""Configuration: one strict, versioned YAML file loaded into frozen value classes."""

from slurmiso.config.loader import DEFAULT_PATH, config_path, load_config, parse_config
from slurmiso.config.model import Config, JobClass, MigLayout, Pool

__all__ = [
    "DEFAULT_PATH",
    "Config",
    "JobClass",
    "MigLayout",
    "Pool",
    "config_path",
    "load_config",
    "parse_config",
]
