"""`make up` shows the console and production does not: the shipped config turns it on with the admin
key the README names; the deployment configs leave it off."""

from __future__ import annotations

from contracts.config import hash_api_key, load_config
from devstack.banner import DEMO_ADMIN_KEY
from tests.stack_config import ROOT


def test_make_up_signs_in_with_the_readme_key_and_deployments_leave_it_off() -> None:
    shipped = load_config(ROOT / "modelyard.yaml")
    assert shipped.console.enabled and hash_api_key(DEMO_ADMIN_KEY) in shipped.keys.admin_keys
    readme = (ROOT / "README.md").read_text()
    assert f"`{DEMO_ADMIN_KEY}`" in readme and "/console" in readme
    for deployed in ("deploy/compose/modelyard.yaml", "deploy/kubernetes/base/modelyard.yaml"):
        assert not load_config(ROOT / deployed).console.enabled, deployed
