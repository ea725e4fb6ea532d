"""The Dagster UI in a real browser: headless Debian Chromium driven by Playwright against ``dagster dev``.

It finds every asset of the loaded definitions in its group's graph, launches a materialization of
``failure_buffer`` from the asset page and sees the run succeed, and screenshots the asset graph.
Outside CI it skips (with the reason) only when Chromium or Playwright is absent; in CI (``CI=true``) it must run.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from agenttune_assets.instance import template_path

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _require_browser():
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"Debian's chromium at {CHROMIUM} (opt in with `bash .ci/install-chromium`; .ci/run does it in CI)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package (pip install playwright)")
    if missing and not IN_CI:
        pytest.skip("browser test needs " + " and ".join(missing))
    assert not missing, "CI must run the browser test; missing " + " and ".join(missing)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory):
    _require_browser()
    root = tmp_path_factory.mktemp("ui")
    dagster_home = root / "dagster"
    dagster_home.mkdir()
    shutil.copyfile(template_path("sqlite"), dagster_home / "dagster.yaml")
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "AGENTTUNE_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}
    log = open(root / "dagster-dev.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if urllib.request.urlopen(url + "/server_info", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dagster dev did not come up: {(root / 'dagster-dev.log').read_text()[-3000:]}")
            time.sleep(2)
        yield url, root
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def page(dagster_ui):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        pg = browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.set_default_timeout(120_000)
        # The instance templates turn Dagster's sign-up modal off; should a Dagster version show it anyway, close it
        # whenever it covers the element an action waits for.
        pg.add_locator_handler(pg.get_by_placeholder("hello@dagster.io"), lambda: _close_signup(pg))
        yield pg
        browser.close()


def _close_signup(pg):
    skip = pg.get_by_role("button", name="Skip")
    if skip.count():
        skip.first.click()
    else:
        pg.keyboard.press("Escape")


def _dismiss(pg):
    skip = pg.get_by_role("button", name="Skip")
    if skip.count():
        skip.first.click()


def _groups() -> dict[str, list[str]]:
    warnings.simplefilter("ignore")
    from agenttune_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    groups: dict[str, list[str]] = {}
    for key in graph.materializable_asset_keys:
        groups.setdefault(graph.get(key).group_name, []).append(key.path[-1])  # the graph node shows the last path component
    return groups


def test_every_asset_is_in_the_graph(dagster_ui, page):
    url, root = dagster_ui
    groups = _groups()
    assert "deploy" in groups and {"failure_buffer", "gate_decision", "deployed_adapter"} <= set(groups["deploy"])
    for group, keys in sorted(groups.items()):
        page.goto(f"{url}/locations/agenttune/asset-groups/{group}", wait_until="networkidle")
        _dismiss(page)
        for key in keys:
            page.get_by_text(key, exact=True).first.wait_for(state="visible")
        if group == "deploy":
            shots = Path(os.environ.get("AGENTTUNE_UI_SCREENSHOTS", root))
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "asset-graph-deploy.png"))
    page.goto(f"{url}/asset-groups", wait_until="networkidle")
    _dismiss(page)
    for group in groups:
        page.get_by_text(group, exact=True).first.wait_for(state="visible")


def test_materialization_launched_from_the_ui_succeeds(dagster_ui, page):
    url, _ = dagster_ui
    page.goto(f"{url}/assets/failure_buffer", wait_until="networkidle")
    _dismiss(page)
    import re

    page.locator("button").filter(has_text=re.compile(r"^\s*Materialize\s*$")).first.click()
    page.wait_for_timeout(2000)
    # Dagster asks to confirm when an upstream asset (decide_runs) has never been materialized.
    confirm = page.get_by_role("button", name="Confirm")
    if confirm.count():
        confirm.first.click()
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(5000)  # let the launch mutation finish before leaving the page
    page.goto(f"{url}/runs", wait_until="networkidle")
    _dismiss(page)
    deadline = time.monotonic() + 300
    while True:
        body = page.inner_text("body")
        if "Success" in body:
            break
        assert "Failure" not in body, body[:2000]
        assert time.monotonic() < deadline, "the run did not finish within 5 minutes: " + body[:2000]
        page.wait_for_timeout(3000)
        page.reload(wait_until="networkidle")
    page.get_by_text("failure_buffer").first.wait_for(state="visible")
