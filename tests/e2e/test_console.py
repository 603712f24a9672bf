"""The operator's console in a real browser (Debian's Chromium, headless, driven by Selenium through
chromium-driver) and over plain HTTP, on one stack: Envoy, two extproc workers subscribed to a control
plane, the demo upstream. The browser signs in, creates a key, uses it with the OpenAI SDK through
Envoy, sees its spend, revokes it and sees the SDK's 401; it applies a config change and sees the new
version on every worker. Each page's screenshot lands in build/artifacts/console/. The HTTP tests
check the security rules: no page or action without a session, forged and replayed CSRF tokens
refused, a secret rendered once, markup in a key name shown as text."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from contracts.config import hash_api_key
from contracts.live_config import STATUS_PATH
from keys.secret import digest_of
from tests.stack_config import free_port, free_ports_run, small_config, start_stack

pytestmark = pytest.mark.e2e
ADMIN_KEY = "adm-console-e2e"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "artifacts" / "console"
PAGES = ("keys", "spend", "models", "limits", "config", "audit")
NEW_TENANT_KEY = "sk-console-applied"
WORKERS_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("console")
    data = small_config()
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, audit_db="audit.sqlite", metering_db="metering.sqlite", tasks=None, batches=None)
    data["models"][0]["deployments"][0].pop("warmup", None)
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)]}
    data["console"] = {"enabled": True}
    api = f"127.0.0.1:{free_port()}"
    data["controlplane"] = {"enabled": True, "xds_address": f"127.0.0.1:{free_port()}", "api_address": api}
    with start_stack(workdir, data) as s:
        s.test_api = f"http://{api}"
        s.test_config = workdir / "modelyard.yaml"
        # Both workers subscribed: the second imports after the stack is up (a bound, not the plan: a
        # second or two here, tens of seconds on a loaded 2-core box).
        t0 = time.monotonic()
        while len((st := httpx.get(s.test_api + STATUS_PATH, timeout=5).json())["workers"]) != 2:
            log = (workdir / "extproc.log").read_text()[-2000:] if (workdir / "extproc.log").exists() else ""
            assert time.monotonic() - t0 < WORKERS_WITHIN_S, f"workers subscribed: {st['workers']}\n{log}"
            time.sleep(0.2)
        yield s


def until(check: Callable[[], Any], within: float, every: float = 0.1) -> Any:
    t0 = time.monotonic()
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() - t0 < within, f"not within {within}s"
        time.sleep(every)


# ------------------------------------------------------------------ over HTTP: the security rules

def signed_in(stack: Any) -> httpx.Client:
    client = httpx.Client(base_url=stack.url, timeout=20)
    r = client.post("/console/login", data={"key": ADMIN_KEY})
    assert r.status_code == 303 and r.headers["location"] == "/console/keys"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS the cookie is Secure (tests/console)
    return client


def tokens(html: str) -> list[str]:
    return re.findall(r'name="csrf" value="([^"]+)"', html)


def test_nothing_answers_without_a_session(stack: Any) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as anon:
        for page in PAGES:
            for cookie in ("", "modelyard_console=forged"):
                r = anon.get(f"/console/{page}", headers={"cookie": cookie} if cookie else {})
                assert r.status_code == 303 and r.headers["location"] == "/console/login", (page, r.text[:200])
        for action in ("keys", "keys/key_0123456789abcdef/revoke", "keys/key_0123456789abcdef/rotate", "config",
                       "logout"):
            r = anon.post(f"/console/{action}", data={"csrf": "1.2.3", "tenant": "demo"})
            assert r.status_code == 401, action
        r = anon.post("/console/login", data={"key": "sk-modelyard-demo"})  # a tenant's key is no admin key
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert anon.get("/console/static/console.css").status_code == 200  # the assets are public


def test_forged_and_replayed_csrf_tokens_are_refused(stack: Any) -> None:
    client, other = signed_in(stack), signed_in(stack)
    page = client.get("/console/keys").text
    token = tokens(page)[-1]  # the create form's
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    form = {"tenant": "demo", "name": "csrf probe"}
    assert client.post("/console/keys", data={**form, "csrf": forged}).status_code == 403
    assert client.post("/console/keys", data=form).status_code == 403  # none at all
    theirs = tokens(other.get("/console/keys").text)[-1]  # minted for another session
    assert client.post("/console/keys", data={**form, "csrf": theirs}).status_code == 403
    first = client.post("/console/keys", data={**form, "csrf": token})
    assert first.status_code == 200 and 'id="new-secret"' in first.text
    replay = client.post("/console/keys", data={**form, "csrf": token})
    assert replay.status_code == 403 and "already used" in replay.text
    listed = client.get("/console/keys").text
    assert listed.count("csrf probe") == 1  # the forged, missing, foreign and replayed ones made nothing


def test_a_secret_is_shown_once_and_markup_is_text(stack: Any) -> None:
    client = signed_in(stack)
    name = '<script>alert("x")</script><b>bold</b>'
    r = client.post("/console/keys", data={"tenant": "demo", "name": name, "models": "demo-gpt",
                                           "csrf": tokens(client.get("/console/keys").text)[-1]})
    secret = re.search(r'id="new-secret"[^>]*>([^<]+)<', r.text)
    assert secret is not None and secret.group(1).startswith("my-")
    assert r.text.count(secret.group(1)) == 1
    assert "<script>alert" not in r.text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in r.text
    for page in PAGES:
        again = client.get(f"/console/{page}")
        assert again.status_code == 200, page
        assert secret.group(1) not in again.text, page
        assert "<script>alert" not in again.text
        assert again.headers["cache-control"] == "no-store" and "default-src 'none'" in \
            again.headers["content-security-policy"]


# ------------------------------------------------------------------ in Chromium

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_bin is None:
        pytest.skip("needs Debian's chromium and chromium-driver (`make system-tools` installs them)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("needs selenium (the dev extra: pip install -e '.[dev]')")
    opts = Options()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_bin), options=opts)
    driver.implicitly_wait(0)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def by_css(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def _alert(driver: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        driver.switch_to.alert  # noqa: B018 (the property raises without one)
        return True
    except NoAlertPresentException:
        return False


def submit(driver: Any, form_css: str, confirm: bool = False) -> None:
    """Submit and wait for the answer's page. The old document is marked first: right after the click it
    still reads "complete", so only a document without the mark is the answer."""
    driver.execute_script("document.documentElement.dataset.consoleOld = '1'")
    by_css(driver, f"{form_css} button[type=submit]").click()
    if confirm:
        until(lambda: _alert(driver), 5)
        driver.switch_to.alert.accept()
    until(lambda: _answered(driver), 20)


def _answered(driver: Any) -> bool:
    from selenium.common.exceptions import WebDriverException

    try:
        return bool(driver.execute_script(
            "return document.readyState === 'complete' && !document.documentElement.dataset.consoleOld"))
    except WebDriverException:  # the navigation is under way: no document to ask yet
        return False


def test_browser_key_lifecycle_through_envoy(stack: Any, browser: Any) -> None:
    d = browser
    d.get(f"{stack.url}/console")
    assert d.current_url.endswith("/console/login")
    shot(d, "login")
    by_css(d, "#f-key").send_keys(ADMIN_KEY)
    submit(d, "form")
    assert d.current_url.endswith("/console/keys")
    by_css(d, "#f-name").send_keys("<i>browser</i> key")
    by_css(d, "#f-models").send_keys("demo-gpt")
    by_css(d, "#f-budget_usd").send_keys("5")
    submit(d, "#create-key")
    secret = by_css(d, "#new-secret").text
    key_id = re.search(r"key_[0-9a-f]{16}", by_css(d, "#shown").text).group(0)  # type: ignore[union-attr]
    assert secret.startswith("my-") and "<i>browser</i> key" in by_css(d, "#keys").text
    shot(d, "keys")

    sdk = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=secret, max_retries=0)
    answer = sdk.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "hi from the console"}])
    assert answer.choices[0].message.content

    def spend_shows_key() -> bool:
        d.get(f"{stack.url}/console/spend?by=key&since=1h")
        table = d.find_elements("css selector", "#spend")  # the budgets table names the key from the start
        return bool(table) and key_id in table[0].text

    until(spend_shows_key, 10, every=0.3)  # the metering writer batches its rows
    assert "<svg" in d.page_source and by_css(d, "#spend-chart")
    budget = [r for r in by_css(d, "#budgets").text.splitlines() if key_id in r]
    assert budget and "5.00" in budget[0] and "month" in budget[0], budget  # its use against its cap
    shot(d, "spend")

    d.get(f"{stack.url}/console/keys")
    submit(d, f"form[action='/console/keys/{key_id}/revoke']", confirm=True)
    assert f"Revoked {key_id}" in by_css(d, "main").text
    assert d.page_source.count(secret) == 0  # never rendered again

    def refused() -> bool:
        try:
            sdk.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "still?"}])
        except openai.AuthenticationError:
            return True
        return False

    until(refused, 3, every=0.2)  # every worker: its refresh (keys.refresh_s) or this one's own write

    def audited() -> str:  # the audit writer gathers rows for up to 200 ms before it commits them
        d.get(f"{stack.url}/console/audit?event=key_admin&verify=1")
        text = by_css(d, "#audit").text
        return text if "create" in text and "revoke" in text and key_id in text else ""

    audit = until(audited, 10, every=0.3)
    assert "create" in audit and "revoke" in audit and key_id in audit
    assert "intact" in by_css(d, "#verdict").text
    shot(d, "audit")


def test_browser_applies_a_config_on_every_worker(stack: Any, browser: Any) -> None:
    d = browser
    d.get(f"{stack.url}/console/config")
    before = by_css(d, "#running-version").text
    data = yaml.safe_load(by_css(d, "#f-yaml").get_attribute("value"))
    data["tenants"].append({"name": "console-applied", "tier": "L2", "allowed_models": ["*"],
                            "api_keys": [f"sha256:{hash_api_key(NEW_TENANT_KEY)}"]})
    d.execute_script("arguments[0].value = arguments[1]", by_css(d, "#f-yaml"), yaml.safe_dump(data, sort_keys=False))
    submit(d, "#apply")
    main = by_css(d, "main").text
    assert "Applied version" in main or "Applying" in main, main[:500]

    def everyone_runs_it() -> str | None:
        st = httpx.get(stack.test_api + STATUS_PATH, timeout=5).json()
        runs = st["version"] != before and len(st["workers"]) == 2 and \
            all(w["version"] == st["version"] for w in st["workers"]) and \
            all(s["version"] == st["version"] for s in st["envoy"]["streams"])
        return st["version"] if runs else None

    version = until(everyone_runs_it, 30, every=0.3)
    d.get(f"{stack.url}/console/config")
    assert by_css(d, "#running-version").text == version
    rows = [r for r in by_css(d, "#versions").text.splitlines() if r.startswith("worker")]
    assert len(rows) == 2 and all(version in r for r in rows), rows
    assert "every Envoy and worker runs it" in by_css(d, "#sync").text
    assert "console-applied" in by_css(d, "#diff").text and "console:" in by_css(d, "#history").text
    shot(d, "config")
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {NEW_TENANT_KEY}"},
                   json={"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert r.status_code == 200, r.text  # the applied tenant's key answers through Envoy


def test_browser_explains_a_route_and_tunes_a_limit(stack: Any, browser: Any) -> None:
    d = browser
    d.get(f"{stack.url}/console/models")
    assert "demo-openai" in by_css(d, "#deployments").text
    by_css(d, "#f-prompt_tokens").clear()
    by_css(d, "#f-prompt_tokens").send_keys("1200")
    submit(d, "#explain-form")
    assert "demo-openai" in by_css(d, "#explain-verdict").text
    assert "demo-openai" in by_css(d, "#explain").text
    shot(d, "models")
    d.get(f"{stack.url}/console/limits")
    assert by_css(d, "#limits-head").text.startswith("backend")
    by_css(d, "#f-since").clear()
    by_css(d, "#f-since").send_keys("1h")
    submit(d, "#tune-form")
    tuned = by_css(d, "#tune").text
    assert "demo" in tuned, tuned  # the calls above, replayed from the metering store
    assert d.find_elements("css selector", "svg.chart.line"), "the frontier plot"
    shot(d, "limits")
