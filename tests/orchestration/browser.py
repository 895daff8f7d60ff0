"""A real browser for the UI tests: Debian's chromium, headless, driven by Playwright's Python package (no browser
download: `executable_path` is the system chromium). Screenshots go to outputs/test-artifacts/screenshots/."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO

CHROMIUM = Path("/usr/bin/chromium")  # `make install-dev` installs it (apt) where it is missing
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
SCREENSHOTS = REPO / "outputs" / "test-artifacts" / "screenshots"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TIMEOUT_MS = 120_000  # per action: the UIs render slowly on two shared cores


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A Playwright browser context (1400x1000) on the system chromium; closed at the end."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: `make install-dev` installs it"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.set_default_timeout(TIMEOUT_MS)
            yield context
        finally:
            browser.close()


def screenshot(page, name: str) -> Path:
    """`page` as outputs/test-artifacts/screenshots/`name`.png (printed: pytest shows it with -s or on failure);
    checked to be a non-empty PNG."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{path}: not a screenshot ({len(data)} bytes)"
    print(f"screenshot: {path}")
    return path


def airflow_login(context, url: str, password: str, next_path: str):
    """A page logged into the Airflow UI as the simple auth manager's admin, at `next_path`."""
    from urllib.parse import quote

    page = context.new_page()
    page.goto(f"{url}/auth/login?next={quote(next_path, safe='')}")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"**{next_path}")
    page.wait_for_load_state("networkidle")  # the React app has its data (and handlers) once the page is quiet
    return page


@dataclass
class TriggerForm:
    sections: list[str]  # the form's groups, as shown
    labels: list[str]  # the fields of the changed key's section
    options: list[str]  # the changed key's drop-down
    required: list[str]  # the fields of that section marked required
    status: int  # of the POST the Trigger button sent
    run: dict  # its answer: the new DAG run


def trigger_from_form(page, key: str, value: str) -> TriggerForm:
    """On a DAG's page: open the trigger form, open `key`'s section, pick `value` in its drop-down (a react-select),
    screenshot the form, press Trigger."""
    page.get_by_test_id("trigger-dag-button").click()
    dialog = page.get_by_role("dialog")
    groups = dialog.locator("[data-scope=accordion][data-part=item-trigger]")
    groups.first.wait_for()
    sections = [text.strip() for text in groups.all_inner_texts()]
    section = key.split(".", 1)[0]
    dialog.get_by_role("button", name=section, exact=True).click()
    region = dialog.get_by_role("region", name=section)
    labels = [text.split("\n")[0].strip() for text in region.locator("label").all_inner_texts() if text.strip()]
    required = region.locator("label[data-required]").evaluate_all("labels => labels.map(l => l.firstChild.textContent.trim())")  # marked "*"
    region.locator(f"[id='element_{key}']").click()
    options = [text.strip() for text in page.get_by_role("option").all_inner_texts()]
    page.get_by_role("option", name=value, exact=True).click()
    screenshot(page, "airflow-trigger-form")
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/dagRuns")) as answer:
        dialog.get_by_role("button", name="Trigger", exact=True).click()
    return TriggerForm(sections, labels, options, required, answer.value.status, answer.value.json())


def mlflow_compare(context, url: str, experiment_id: str, run_ids: list[str]) -> Path:
    """The MLflow UI's compare view of `run_ids`, once it shows them all: its screenshot."""
    page = context.new_page()
    page.goto(f"{url}/#/compare-runs?runs={json.dumps(run_ids)}&experiments={json.dumps([experiment_id])}")
    page.get_by_text(f"Comparing {len(run_ids)} Runs from 1 Experiment").wait_for()
    for run_id in run_ids:
        page.get_by_text(run_id, exact=True).first.wait_for()
    page.locator("[data-component-id='mlflow.assistant.chat_panel.close']").click()  # MLflow 3 opens its assistant beside the runs
    page.wait_for_timeout(2000)  # the plots draw after the table
    return screenshot(page, "mlflow-compare-runs")
