"""The printed link in a real browser: Debian's chromium, driven by Playwright, against `pipeline ui`.

Opens what a user opens after `pipeline run`, with no clicks: Model training mode, the sweep's
children flat under the saved view, the comparison charts, and the parent's description with its
chart. Set PIPELINE_SCREENSHOT_DIR to keep the screenshots (README section 6 uses them).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import free_port, invoke, service_output, start_service, stop_service, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NO_BROWSER = "needs Debian's chromium: sudo apt-get install chromium (make test installs it when run as root)"

GRID = "experiment: ui-walk\ngrid:\n  batch_size: [64, 128]\n  num_workers: [0, 1]\n  device: [cpu]\n  epochs: [2]\n"


@pytest.fixture(scope="module")
def ui(tmp_path_factory, data_dir, _store_template):
    """A 4-point sweep in a sqlite store, and `pipeline ui` serving it on a free port."""
    folder = tmp_path_factory.mktemp("ui")
    shutil.copy(_store_template, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    (folder / "grid.yaml").write_text(GRID)
    out = invoke("run", str(folder / "grid.yaml"), "--tracking-uri", uri, "--data-dir", str(data_dir))
    assert out.exit_code == 0, out.output
    link = re.search(r"http://127\.0\.0\.1:5000/(#/experiments/\S+)", " ".join(out.output.split())).group(1)
    port = free_port()
    server = start_service([sys.executable, "-m", "pipeline", "ui", "--port", str(port), "--tracking-uri", uri],
                           cwd=folder)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", server)
        yield f"http://127.0.0.1:{port}/", link, service_output(server)
    finally:
        stop_service(server)


def test_pipeline_ui_serves_the_store_and_prints_the_latest_sweeps_view(ui):
    base, link, output = ui
    first = output.splitlines()[0]
    assert first.startswith("MLflow UI for sqlite:///") and "mlflow.db" in first
    assert f"{base}{link}" in first  # the same view `pipeline run` printed, on the UI's own port


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(NO_BROWSER)
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' installs playwright")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


def _page(browser, url: str):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})  # a fresh profile: what a new user has
    page.goto(url)
    return page


def _keep(page, name: str) -> None:
    folder = os.environ.get("PIPELINE_SCREENSHOT_DIR")
    if folder:
        page.screenshot(path=str(Path(folder) / name))


@pytest.mark.browser
def test_the_printed_link_opens_the_comparison_with_no_clicks(ui, browser):
    """The issue's acceptance: no GenAI sidebar, the four children by name, the columns, a saved view."""
    from playwright.sync_api import expect

    base, link, _ = ui
    page = _page(browser, base + link)
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    for name in ("cpu bs64 w0", "cpu bs64 w1", "cpu bs128 w0", "cpu bs128 w1"):
        expect(page.get_by_text(name, exact=True)).to_be_visible()  # flat: not folded under the parent
    for column in ("device", "batch_size", "num_workers", "epoch_duration_s", "images_per_s", "test_accuracy"):
        expect(page.get_by_role("columnheader", name=re.compile(column)).first).to_be_visible()
    expect(page.get_by_text("4 matching runs")).to_be_visible()
    assert "workflowType=machine_learning" in page.url
    for genai in ("Judges", "Playground"):  # the GenAI sidebar's entries: not this mode
        expect(page.get_by_text(genai, exact=True)).to_have_count(0)
    _keep(page, "ui-table.png")
    page.close()


@pytest.mark.browser
def test_the_charts_are_one_click_away(ui, browser):
    from playwright.sync_api import expect

    base, link, _ = ui
    page = _page(browser, base + link.replace("compareRunsMode=TABLE", "compareRunsMode=CHART"))
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Comparison", exact=True).first).to_be_visible()
    expect(page.get_by_text("Parallel Coordinates").first).to_be_visible()
    for title in ("epoch_duration_s", "test_accuracy"):
        expect(page.get_by_text(title, exact=True).first).to_be_visible()
    _keep(page, "ui-charts.png")
    page.close()


@pytest.mark.browser
def test_the_parent_run_describes_the_sweep_with_its_chart(ui, browser):
    import mlflow

    base, link, _ = ui
    experiment_id = re.search(r"experiments/(\d+)", link).group(1)
    store = ui_store(base)
    client = mlflow.MlflowClient(store)
    (parent,) = client.search_runs([experiment_id], "tags.`pipeline.role` = 'sweep'")
    page = _page(browser, f"{base}#/experiments/{experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning")
    from playwright.sync_api import expect

    expect(page.get_by_text("Sweep of")).to_be_visible(timeout=60_000)
    more = page.get_by_role("button", name="Expand description")
    if more.count():
        more.click()
    image = page.locator("img[src*='get-artifact']")
    expect(image).to_be_visible()
    assert image.evaluate("img => img.complete && img.naturalWidth > 0")  # the chart loaded, not a broken image
    expect(page.get_by_text("test acc").first).to_be_visible()  # the results table under the chart
    _keep(page, "ui-parent.png")
    page.close()


def ui_store(base: str) -> str:
    """The UI's own REST API reads the same store."""
    return base.rstrip("/")
