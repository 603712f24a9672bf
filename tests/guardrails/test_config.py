"""The `guardrails:` section refused at load with its key path, never at a caller's request."""

from __future__ import annotations

import pytest

from contracts.config import parse_config
from contracts.errors import ConfigError
from tests.stack_config import small_config


def test_config_refuses_a_bad_policy() -> None:
    data = small_config()
    data["guardrails"] = {"policies": [{"name": "x", "applies_to": {"tenants": ["demo"]},
                                        "checks": [{"type": "regex", "pattern": "("}]}]}
    with pytest.raises(ConfigError, match=r"guardrails.policies\[0\].checks\[0\].pattern"):
        parse_config(data)
    data["guardrails"] = {"policies": [{"name": "x", "applies_to": {}, "checks": [{"type": "email"}]}]}
    with pytest.raises(ConfigError, match=r"guardrails.policies\[0\]: .*cover nothing"):
        parse_config(data)
    data["guardrails"] = {"policies": [{"name": "x", "applies_to": {"tenants": ["demo"]},
                                        "checks": [{"type": "email", "on": "output"}]}]}
    with pytest.raises(ConfigError, match=r"guardrails.policies\[0\].checks\[0\].on: Extra inputs"):
        parse_config(data)


def test_an_undefined_tenant_is_a_warning_not_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    data = small_config()
    data["guardrails"] = {"policies": [{"name": "x", "applies_to": {"tenants": ["nobody"]},
                                        "checks": [{"type": "email"}]}]}
    parse_config(data)
    assert "guardrails.policies[0].applies_to.tenants: 'nobody' is not defined" in caplog.text
