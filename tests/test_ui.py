"""The printed link in a real browser: Debian's chromium, driven by Playwright, against `pipeline ui`.

Opens what a user opens after `pipeline run`, with no clicks: Model training mode, the sweep's
children flat under the saved view (each with the figures `pipeline compare` prints, in a colour of
its own), the comparison charts (speed against accuracy first), the parent's description with its
chart, and the way back to the view after a run page. Set PIPELINE_SCREENSHOT_DIR to keep the
screenshots (README section 6 uses them).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import free_port, invoke, isolated, service_output, start_service, stop_service, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NO_BROWSER = "needs Debian's chromium: sudo apt-get install chromium (make test installs it when run as root)"

GRID = ("experiment: ui-walk\ngrid:\n  batch_size: [64, 128]\n  num_workers: [0, 1]\n  shuffle: [true, false]\n"
        "  device: [cpu]\n  epochs: [2]\n")
NAMES = [f"cpu bs{b} w{w} {s}" for b in (64, 128) for w in (0, 1) for s in ("shuffle", "noshuffle")]


@pytest.fixture(scope="module")
def ui(tmp_path_factory, data_dir, _store_template):
    """An 8-point sweep in a sqlite store, and `pipeline ui` serving it on a free port."""
    folder = tmp_path_factory.mktemp("ui")
    shutil.copy(_store_template, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    (folder / "grid.yaml").write_text(GRID)
    with isolated(folder):  # as every test's runs: none counted contended, so the view has every figure
        out = invoke("run", str(folder / "grid.yaml"), "--tracking-uri", uri, "--data-dir", str(data_dir))
    assert out.exit_code == 0, out.output
    link = re.search(r"http://127\.0\.0\.1:5000/(#/experiments/\S+)", " ".join(out.output.split())).group(1)
    port = free_port()
    server = start_service([sys.executable, "-m", "pipeline", "ui", "--port", str(port), "--tracking-uri", uri],
                           cwd=folder)
    try:
        wait_for(f"http://127.0.0.1:{port}/health", server)
        yield f"http://127.0.0.1:{port}/", link, service_output(server), uri
    finally:
        stop_service(server)


def test_pipeline_ui_serves_the_store_and_prints_the_latest_sweeps_view(ui):
    base, link, output, _ = ui
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

    base, link, *_ = ui
    page = _page(browser, base + link)
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    for name in NAMES:
        expect(page.get_by_text(name, exact=True)).to_be_visible()  # flat: not folded under the parent
    for column in ("device", "batch_size", "num_workers", "shuffle", "steady_epoch_s", "steady_images_per_s"):
        expect(page.get_by_role("columnheader", name=re.compile(column)).first).to_be_visible()
    expect(page.get_by_text("8 matching runs")).to_be_visible()
    # The first row is the run the verdict names best (the view sorts by each child's rank).
    import mlflow

    client = mlflow.MlflowClient(ui[3])
    parent = re.search(r"viewStateShareKey=sweep-(\w+)", link).group(1)
    best = client.get_run(client.get_run(parent).data.tags["pipeline.best_run"]).info.run_name
    first = " ".join(page.locator('[row-index="0"]').all_inner_texts())
    assert [name for name in NAMES if name in first] == [best], (first, best)
    assert "workflowType=machine_learning" in page.url
    for genai in ("Judges", "Playground"):  # the GenAI sidebar's entries: not this mode
        expect(page.get_by_text(genai, exact=True)).to_have_count(0)
    _keep(page, "ui-table.png")
    page.close()


@pytest.mark.browser
def test_the_charts_are_one_click_away(ui, browser):
    from playwright.sync_api import expect

    base, link, *_ = ui
    page = _page(browser, base + link.replace("compareRunsMode=TABLE", "compareRunsMode=CHART"))
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Comparison", exact=True).first).to_be_visible()
    expect(page.get_by_text("Parallel Coordinates").first).to_be_visible()
    for title in ("steady_epoch_s", "final_test_accuracy"):
        expect(page.get_by_text(title, exact=True).first).to_be_visible()
    # Speed against accuracy is the first chart: left of the epoch-time bars, above the rest.
    scatter = page.get_by_text(re.compile(r"^steady_epoch_s vs\. ")).first.bounding_box()
    titles = [box for box in (t.bounding_box() for t in page.get_by_text("steady_epoch_s", exact=True).all()) if box]
    parallel = page.get_by_text("Parallel Coordinates").first.bounding_box()
    assert [box for box in titles if abs(box["y"] - scatter["y"]) < 20 and box["x"] > scatter["x"]], (scatter, titles)
    assert scatter["y"] < parallel["y"]
    _keep(page, "ui-charts.png")
    page.close()


@pytest.mark.browser
def test_the_parent_run_describes_the_sweep_with_its_chart(ui, browser):
    import mlflow

    base, link, *_ = ui
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
    first = page.locator("img[src*='get-artifact']").first  # speed against accuracy, then epoch time
    expect(first).to_be_visible()
    assert "accuracy_vs_time.png" in first.get_attribute("src")
    loaded = page.locator("img[src*='get-artifact']").evaluate_all(
        "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
    assert loaded == [True, True]  # the charts loaded, not broken images
    expect(page.get_by_text("test acc").first).to_be_visible()  # the results table under the chart
    _keep(page, "ui-parent.png")
    page.close()


def ui_store(base: str) -> str:
    """The UI's own REST API reads the same store."""
    return base.rstrip("/")


# Each row's run name and colour chip (pinned left) and its steady_epoch_s cell, by AG Grid's row index.
_ROWS = """() => {
  const rows = {};
  for (const row of document.querySelectorAll('.ag-pinned-left-cols-container .ag-row')) {
    const chip = [...row.querySelectorAll('*')].find(e => {
      const box = e.getBoundingClientRect(), style = getComputedStyle(e);
      return box.width > 0 && box.width <= 14 && style.backgroundColor !== 'rgba(0, 0, 0, 0)';
    });
    const link = row.querySelector('a');
    rows[row.getAttribute('row-index')] = {name: link && link.innerText.trim(),
                                           colour: chip && getComputedStyle(chip).backgroundColor};
  }
  for (const cell of document.querySelectorAll('.ag-center-cols-container .ag-row [col-id*="steady_epoch_s"]')) {
    const index = cell.closest('.ag-row').getAttribute('row-index');
    if (rows[index]) rows[index].epoch = cell.innerText.trim();
  }
  return Object.values(rows);
}"""


@pytest.mark.browser
def test_the_view_shows_comparisons_figures_in_distinct_colours_and_its_link_restores_it(ui, browser):
    """The issue's acceptance: each child's epoch figure in the view is the one `pipeline compare
    --format json` gives its setting; every child has its own colour; after a run page and Back the
    UI drops the view's columns (MLflow 3.17.2), and the experiment's description brings them back in
    one click (a new tab, where the link is applied afresh)."""
    import json

    import mlflow
    from playwright.sync_api import expect

    base, link, _, uri = ui
    parent = re.search(r"viewStateShareKey=sweep-(\w+)", link).group(1)
    out = invoke("compare", "--parent-run", parent, "--tracking-uri", uri, "--format", "json")
    assert out.exit_code == 0, out.output
    expected = {row["run_name"]: row["steady_epoch_s"] for row in json.loads(out.stdout)}
    assert sorted(expected) == sorted(NAMES)  # one run per setting: its row is its run
    page = _page(browser, base + link)
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(page.locator('.ag-center-cols-container [col-id*="steady_epoch_s"]')).to_have_count(8)
    rows = page.evaluate(_ROWS)
    assert {row["name"]: float(row["epoch"]) for row in rows} == expected
    assert None not in [row["colour"] for row in rows] and len({row["colour"] for row in rows}) == 8, rows

    client = mlflow.MlflowClient(uri)
    children = client.search_runs([re.search(r"experiments/(\d+)", link).group(1)],
                                  f"tags.`mlflow.parentRunId` = '{parent}'")
    assert all(len(run.inputs.dataset_inputs) == 2 for run in children)  # training and test splits
    # The Dataset column is the view's last: scroll the grid to it (AG Grid renders the columns in view).
    page.locator(".ag-center-cols-viewport").first.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
    expect(page.get_by_role("columnheader", name="Dataset").first).to_be_visible()
    split = children[0].inputs.dataset_inputs[0].dataset.name  # e.g. "fashion0-train"
    expect(page.locator(".ag-center-cols-container").get_by_text(split).first).to_be_visible()

    page.get_by_text(NAMES[0], exact=True).first.click()
    expect(page).to_have_url(re.compile(r"/runs/\w+"))
    page.go_back()
    expect(page.get_by_text("8 matching runs")).to_be_visible(timeout=30_000)  # filter and sort kept
    restore = page.get_by_role("link", name="Open the latest sweep's comparison view")
    with page.context.expect_page() as opened:
        restore.click()
    again = opened.value
    expect(again.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(again.get_by_role("columnheader", name=re.compile("steady_epoch_s")).first).to_be_visible()
    again.close()
    page.close()
