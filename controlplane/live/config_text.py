"""A config offered as text (an apply's body, a watched file): parsed by the loader every command
uses. Light on purpose: `modelyard apply` checks a file with it before it loads anything of Envoy's."""

from __future__ import annotations

import yaml

from contracts.config import GatewayConfig, parse_config
from contracts.errors import ConfigError


def parse_text(text: bytes, source: str) -> GatewayConfig:
    """The config in `text`, or ConfigError naming what is wrong (as `load_config` says it)."""
    try:
        data = yaml.safe_load(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({e})") from None
    return parse_config(data, source)
