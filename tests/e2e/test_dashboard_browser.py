"""GET /dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven
by selenium) against one real server with an API key, under a small load: no console
errors, every panel renders, the page's KV numbers equal /server_info's, a running
request appears and its KV slots show on the pool bar, a flush empties the tree, the page
shows the drain. /dashboard/events with and without the key. The screenshot goes to
$RADIXLM_TEST_ARTIFACTS (default test-artifacts/); with RADIXLM_UPDATE_SCREENSHOTS=1 it
also replaces docs/img/dashboard.png."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import make_tiny_llama
from tests.server_harness import RunningServer, running_server

pytestmark = pytest.mark.slow

KEY = "dash-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO = Path(__file__).resolve().parents[2]
LONG = 1500  # output tokens of a request that must still run while the page is checked


def ensure_chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver, installed with apt-get when missing (as
    root); skips the module with the reason when that is impossible."""
    def found() -> tuple[str | None, str | None]:
        return shutil.which("chromium"), shutil.which("chromedriver")
    browser, driver = found()
    if not (browser and driver):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("the dashboard browser test needs Debian's chromium and chromium-driver; "
                        "not installed, and apt-get cannot run here (not root)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            res = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                pytest.skip(f"apt-get could not install chromium and chromium-driver:\n"
                            f"{res.stderr[-1500:]}")
        browser, driver = found()
    assert browser and driver
    return browser, driver


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningServer]:
    # A context long enough for requests that run for seconds on the tiny model.
    model = make_tiny_llama(str(tmp_path_factory.mktemp("tiny_dash")), max_pos=2048)
    with running_server(model, "--max-total-tokens", "8192",
                        "--max-running-requests", "16", "--api-key", KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server) -> Iterator[Any]:
    chromium, chromedriver = ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1700"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
    try:
        driver.get(f"{server.url}/dashboard#key={KEY}")
        yield driver
    finally:
        driver.quit()


def wait_for(pred: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except Exception as e:  # an element not there yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or pred}: last {last!r}")


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def value(driver: Any, elem_id: str) -> int | None:
    v = js(driver, f"return document.getElementById('{elem_id}').dataset.value")
    return int(float(v)) if v not in (None, "") else None


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def server_pool(server: RunningServer) -> dict[str, int]:
    return httpx.get(f"{server.url}/server_info", headers=AUTH, timeout=30).json()["pool"]


def first_event(url: str, headers: dict[str, str]) -> dict[str, Any]:
    with httpx.stream("GET", f"{url}/dashboard/events", headers=headers, timeout=30) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name == "update":
                return json.loads(line[6:])
    raise AssertionError("the stream ended without an update")


def complete(url: str, prompt: str, max_tokens: int) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text


class Load:
    """A small load: a few threads sending short completions with shared prefixes."""

    def __init__(self, url: str, threads: int = 3) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(url, i)) for i in range(threads)]

    def _run(self, url: str, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                complete(url, f"w1 w2 w3 w4 w5 w6 w{7 + i} w{8 + n % 5}", 12)
            except BaseException as e:
                self.errors.append(e)
                return
            n += 1

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)
        assert not self.errors, self.errors


# --- the event stream, without a browser ---------------------------------------------------


def test_event_stream_refuses_without_the_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(f"{server.url}/dashboard/events", headers=headers, timeout=10)
        assert r.status_code == 401, r.text
        assert "API key" in r.json()["error"]["message"]
    # The page itself carries no data: open, so that it can ask for the key.
    page = httpx.get(f"{server.url}/dashboard", timeout=10)
    assert page.status_code == 200 and "radixlm" in page.text
    vendored = httpx.get(f"{server.url}/dashboard/static/vendor/uplot/uPlot.iife.min.js")
    assert vendored.status_code == 200 and "uPlot" in vendored.text


def test_event_stream_with_the_key_matches_server_info(server):
    update = first_event(server.url, AUTH)
    pool = server_pool(server)
    s = update["sched"]
    assert s is not None, update["error"]
    assert s["pool"]["total_kv_slots"] == pool["total_kv_slots"]
    assert s["pool"]["free_kv_slots"] == pool["free_kv_slots"]
    assert s["pool"]["held_by_cache"] == pool["held_by_cache"]
    assert update["memory"]["plan"]["kv_tokens"] == pool["total_kv_slots"]
    assert update["server"]["draining"] is False
    assert len(s["slot_map"]["free"]) == s["slot_map"]["bins"]
    assert sum(s["slot_map"]["free"]) == pool["free_kv_slots"]


# --- the page --------------------------------------------------------------------------------


def test_page_renders_every_panel_without_console_errors(server, browser):
    with Load(server.url):
        wait_for(lambda: int(js(browser, "return document.body.dataset.updates || 0")) >= 3,
                 what="three updates")
        wait_for(lambda: value(browser, "steps-shown"), what="scheduler steps on the timeline")
        wait_for(lambda: js(browser, "return document.querySelectorAll('#icicle .node').length") >= 2,
                 what="radix nodes on the icicle")
    d = browser
    assert js(d, "return document.getElementById('status').textContent") == "serving"
    assert js(d, "return document.querySelectorAll('#mem-bar > div').length") == 5
    assert js(d, "return document.getElementById('mem-bar-weights').dataset.value") != "0"
    assert js(d, "return document.querySelectorAll('#kv-bar > div').length") == 3
    assert js(d, "return document.querySelectorAll('#slot-map .slot').length") == 256
    assert js(d, "return document.querySelectorAll('#panel-sched canvas').length") >= 3
    assert js(d, "return document.querySelectorAll('#flags-table tr').length") > 5
    assert value(d, "hit-tokens") > 0  # the load shares prefixes
    assert console_errors(d) == []


def test_page_numbers_equal_server_info_within_one_update(server, browser):
    def same() -> bool:
        pool = server_pool(server)
        return (value(browser, "kv-free") == pool["free_kv_slots"]
                and value(browser, "kv-cached") == pool["held_by_cache"]
                and value(browser, "kv-running") == pool["held_by_requests"]
                and value(browser, "kv-total") == pool["total_kv_slots"])
    wait_for(same, timeout_s=5, what="the page's KV numbers to equal /server_info's")


def test_started_request_appears_with_its_kv_on_the_pool_bar(server, browser):
    """A running request's row, clicked, outlines its KV slots on the slot map and names
    its KV positions, and the pool bar shows KV held by requests, all while it runs. An
    attempt whose request finished before the page showed it all (a slow page on a loaded
    machine: the request runs for a few seconds) is repeated with a new request, up to
    three times; a page that never shows it fails."""
    def shown() -> bool:
        try:
            return bool(
                js(browser, "return document.querySelectorAll('#slot-map .slot.sel').length")
                and (value(browser, "kv-running") or 0) > 0
                and float(js(browser, "return document.getElementById('kv-bar-running').style.width")
                          .rstrip("%") or 0) > 0
                and "KV positions" in js(browser, "return document.getElementById('slot-sel').textContent"))
        except Exception:  # an element not there yet
            return False

    def running_row() -> Any:
        return next((r for r in browser.find_elements("css selector", "#requests tbody tr[data-rid]")
                     if "running" in r.text), None)

    outcomes = []
    for attempt in range(3):
        done = threading.Thread(target=complete, args=(server.url, f"w9 w8 w7 w6 w{attempt}", LONG))
        done.start()
        try:
            wait_for(running_row, what="the request's row, running").click()
            outcomes.append(wait_for(lambda: "shown" if shown() else (None if done.is_alive() else "left"),
                                     what="its slots, positions and pool share on the page"))
            if outcomes[-1] == "shown":
                save_screenshot(browser, "dashboard.png")
                break
        finally:
            done.join(timeout=120)
    assert outcomes[-1] == "shown", f"the request finished first every time: {outcomes}"
    assert console_errors(browser) == []


def test_flushed_cache_empties_the_tree(server, browser):
    wait_for(lambda: value(browser, "tree-nodes"), what="a non-empty tree")
    wait_for(lambda: server_pool(server)["running"] == 0, what="idle")
    r = httpx.post(f"{server.url}/flush_cache", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    wait_for(lambda: value(browser, "tree-nodes") == 0 and value(browser, "kv-cached") == 0,
             timeout_s=5, what="an empty tree after the flush")
    assert js(browser, "return document.querySelectorAll('#icicle .node').length") == 1  # root
    assert "flushed" in js(browser, "return document.getElementById('cache-events').textContent")
    assert console_errors(browser) == []


def test_page_shows_the_drain(server, browser):
    """Last: SIGTERM with a request in flight; the page says draining, the stream ends."""
    done = threading.Thread(target=lambda: httpx.post(
        f"{server.url}/v1/completions", headers=AUTH, timeout=120,
        json={"prompt": "w3 w4", "max_tokens": LONG, "ignore_eos": True}))
    done.start()
    wait_for(lambda: value(browser, "n-running"), what="the request running")
    server.proc.send_signal(signal.SIGTERM)
    status = wait_for(lambda: (t := js(browser, "return document.getElementById('status').textContent"))
                      .startswith("draining") and t, timeout_s=10, what="the page to show draining")
    assert "in flight" in status
    done.join(timeout=120)
    assert server.proc.wait(timeout=60) == 0  # the open event streams did not hold it up


def save_screenshot(driver: Any, name: str) -> None:
    out = Path(os.environ.get("RADIXLM_TEST_ARTIFACTS", REPO / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out / name))
    if os.environ.get("RADIXLM_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(out / name, REPO / "docs" / "img" / name)
