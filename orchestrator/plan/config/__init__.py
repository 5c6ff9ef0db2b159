"""The run config: typed sections (`schema`), cross-field rules (`rules`), YAML loading (`load`)."""

from .load import ConfigError, dump_config, load_config, parse_config
from .rules import check_layout, cross_field_problems
from .schema import RunConfig

__all__ = [
    "ConfigError",
    "RunConfig",
    "check_layout",
    "cross_field_problems",
    "dump_config",
    "load_config",
    "parse_config",
]
