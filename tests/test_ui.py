"""The printed link in a real browser: Debian's chromium, driven by Playwright, against `pipeline ui`.

Opens what a user opens after `pipeline run` on an 8-setting sweep with repeats, at 1500x1000 with
MLflow's assistant panel as it opens on a first visit, with no clicks: Model training mode, the
verdict in the experiment's description, one row per setting with the figures `pipeline compare
--format json` gives (left of the panel), every setting on the first chart; then the parent's
description (its significance words, no broken link), the report in MLflow's artifact view, the
best model one click away, and the way back to the view after a run page. Set
PIPELINE_SCREENSHOT_DIR to keep the screenshots (docs/comparing.md uses them).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import free_port, invoke, isolated, new_store, service_output, start_service, stop_service, wait_for
from pipeline.present import view

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NO_BROWSER = "needs Debian's chromium: sudo apt-get install chromium (make test installs it when run as root)"

GRID = (
    "experiment: ui-walk\nrepeats: 2\ngrid:\n  batch_size: [64, 128]\n  num_workers: [0, 1]\n"
    "  precision: [fp32, bf16]\n  device: [cpu]\n  epochs: [1]\n"
)
SETTINGS = [f"cpu bs{b} w{w} {p}" for b in (64, 128) for w in (0, 1) for p in ("fp32", "bf16")]


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
    server = start_service(
        [sys.executable, "-m", "pipeline", "ui", "--port", str(port), "--tracking-uri", uri], cwd=folder
    )
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


def _panel_left(page) -> float:
    """Where MLflow's assistant panel begins: it opens by itself on a first visit to a local UI."""
    from playwright.sync_api import expect

    panel = page.get_by_text(re.compile(r"^MLflow Assistant")).first  # its title, with a "Beta" badge
    expect(panel).to_be_visible(timeout=30_000)  # as a new user meets it: open
    return panel.bounding_box()["x"] - 20


def _visible_left_of(page, locator, right: float) -> dict:
    from playwright.sync_api import expect

    expect(locator).to_be_visible()
    box = locator.bounding_box()
    assert box and 0 <= box["y"] < 1000 and box["x"] + min(box["width"], 60) <= right, box
    return box


def _compared(uri: str, parent: str) -> dict[str, dict]:
    import json

    out = invoke("compare", "--parent-run", parent, "--tracking-uri", uri, "--format", "json")
    assert out.exit_code == 0, out.output
    return {" ".join(row["run_name"].split()[:-1]): row for row in json.loads(out.stdout)}  # "cpu bs64 w0 fp32 r1"


def _best(uri: str, link: str):
    """The sweep's parent id and its best run (pipeline.best_run: issue 32's pick, the verdict's)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    parent = re.search(r"viewStateShareKey=sweep-(\w+)", link).group(1)
    return client, parent, client.get_run(client.get_run(parent).data.tags["pipeline.best_run"])


# Each row's name (pinned left: the run's, the setting's name and its repeat), whether the UI cut
# it short, and its setting_steady_epoch_s cell, by row index.
_ROWS = """() => {
  const rows = {};
  for (const row of document.querySelectorAll('.ag-pinned-left-cols-container .ag-row')) {
    const cut = [...row.querySelectorAll('a')].some(e => e.scrollWidth > e.clientWidth + 1);
    rows[row.getAttribute('row-index')] = {name: row.innerText.replace(/\\s+/g, ' ').trim(), cut: cut};
  }
  const cells = '.ag-center-cols-container .ag-row [col-id*="setting_steady_epoch_s"]';
  for (const cell of document.querySelectorAll(cells)) {
    const index = cell.closest('.ag-row').getAttribute('row-index');
    if (rows[index]) rows[index].epoch = cell.innerText.trim();
  }
  return Object.keys(rows).sort((a, b) => a - b).map(k => rows[k]);
}"""


@pytest.mark.browser
def test_the_printed_link_opens_the_verdict_and_the_figures_with_no_clicks(ui, browser):
    """With zero clicks, beside the assistant panel as MLflow opens it: the verdict's line, one row per
    setting (the run that stands for it), each with the figures `pipeline compare --format json` gives
    it, the best setting first; Model training mode, no GenAI sidebar."""
    from playwright.sync_api import expect

    base, link, _, uri = ui
    client, parent, best = _best(uri, link)
    expected = _compared(uri, parent)
    assert sorted(expected) == sorted(SETTINGS)
    page = _page(browser, base + link)
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(page.locator('.ag-center-cols-container [col-id*="setting_steady_epoch_s"]')).to_have_count(8)
    right = _panel_left(page)
    setting = best.data.tags["pipeline.setting"]
    _visible_left_of(page, page.get_by_text(re.compile(rf"^Best: {setting} \(")).first, right)
    for column in ("setting_steady_epoch_s", "setting_images_per_s", "setting_final_test_accuracy"):
        _visible_left_of(page, page.get_by_role("columnheader", name=re.compile(column)).first, right)
    rows = page.evaluate(_ROWS)
    # One row a setting, named in full, its figure as the terminal rounds it (no "(min)"), best first.
    assert len(rows) == 8 and all(re.fullmatch(r"\d+\.\d+", row["epoch"]) for row in rows), rows
    assert not [row for row in rows if row["cut"]], rows
    # The pinned columns read "#9467bd cpu bs64 w0 bf16 r1 16 seconds ago": colour, run name, age.
    shown = {re.search(r"(cpu .+?) r\d+\b", row["name"]).group(1): float(row["epoch"]) for row in rows}
    assert shown == {name: row["steady_epoch_s"] for name, row in expected.items()}
    assert f" {setting} r" in rows[0]["name"]  # the verdict's best first (the view sorts by rank)
    expect(page.get_by_text("8 matching runs")).to_be_visible()
    assert "workflowType=machine_learning" in page.url
    for genai in ("Judges", "Playground"):  # the GenAI sidebar's entries: not this mode
        expect(page.get_by_text(genai, exact=True)).to_have_count(0)
    _keep(page, "ui-table.png")
    page.close()


@pytest.mark.browser
@pytest.mark.parametrize("width, height", [(1024, 768), (1440, 900)])
def test_the_first_lines_links_and_verdict_are_in_sight(ui, browser, width, height):
    """The experiment description's first line, which MLflow folds to one line, with the assistant
    panel open as on a first visit: its three links in sight at 1024x768, and the verdict whole at
    1440x900 (its words end on that first line, left of the panel)."""
    from playwright.sync_api import expect

    base, link, _, uri = ui
    client, parent, best = _best(uri, link)
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(base + link)
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    right = _panel_left(page)
    top = None
    for name in ("its model", "comparison view", "report"):
        found = page.get_by_role("link", name=name, exact=True).first
        box = _visible_left_of(page, found, right)
        top = box["y"] if top is None else top
        assert box["y"] == top and box["height"] < 20, (name, box)  # on the first line, whole
    verdict = page.get_by_text(re.compile(rf"^Best: {best.data.tags['pipeline.setting']}: ")).first
    expect(verdict).to_be_visible()
    if width >= 1440:
        ends = page.evaluate(
            "e => { const r = document.createRange(); r.selectNodeContents(e); const b = r.getClientRects();"
            " return [b.length, b[b.length - 1].right, b[0].top]; }",
            verdict.element_handle(),
        )
        assert ends[0] == 1 and ends[1] <= right and abs(ends[2] - top) < 10, ends
    _keep(page, f"ui-first-line-{width}.png")
    page.close()


@pytest.mark.browser
def test_every_setting_is_on_the_first_chart(ui, browser):
    from playwright.sync_api import expect

    base, link, *_ = ui
    page = _page(browser, base + link.replace("compareRunsMode=TABLE", "compareRunsMode=CHART"))
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Comparison", exact=True).first).to_be_visible()
    scatter = page.locator(".js-plotly-plot").first  # speed against accuracy: the first chart
    expect(scatter).to_be_visible()
    expect(scatter.locator(".scatterlayer .point")).to_have_count(8)  # one point per setting
    _keep(page, "ui-charts.png")
    page.close()


@pytest.mark.browser
def test_the_parent_run_says_significance_in_words_with_no_broken_link(ui, browser):
    from playwright.sync_api import expect

    base, link, _, uri = ui
    client, parent, _ = _best(uri, link)
    experiment_id = re.search(r"experiments/(\d+)", link).group(1)
    page = _page(browser, f"{base}#/experiments/{experiment_id}/runs/{parent}?workflowType=machine_learning")
    expect(page.get_by_text("Sweep of")).to_be_visible(timeout=60_000)
    more = page.get_by_role("button", name="Expand description")
    if more.count():
        more.click()
    said = page.get_by_text(re.compile(r"^bf16 vs fp32, epoch time: "))
    expect(said.first).to_be_visible()
    text = said.first.inner_text()
    assert re.search(r"\[\d+\.\d\d-\d+\.\d\d\] \((n\.s\.|significant)\)|significance withheld", text), text
    # No bracketed figure became a link: every link in the description is one of ours.
    links = page.locator("a").evaluate_all("as => as.map(a => [a.innerText.trim(), a.getAttribute('href') || ''])")
    assert not [text for text, href in links if re.match(r"^[\d.]+-[\d.]+$", text) or href == "n.s."], links
    first = page.locator("img[src*='get-artifact']").first  # speed against accuracy, then epoch time
    expect(first).to_be_visible()
    assert "accuracy_vs_time.png" in first.get_attribute("src")
    charts = page.locator("img[src*='get-artifact']")
    assert charts.count() >= 2
    for chart in charts.all():  # every chart loads, not a broken image; in its own time on a busy machine
        chart.scroll_into_view_if_needed()
        chart.element_handle().wait_for_element_state("stable")
        page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=chart.element_handle(), timeout=30_000)
    _keep(page, "ui-parent.png")
    page.close()


@pytest.mark.browser
def test_the_report_opens_from_the_parents_artifacts_with_the_verdict(ui, browser):
    from playwright.sync_api import expect

    base, link, _, uri = ui
    client, parent, best = _best(uri, link)
    experiment_id = re.search(r"experiments/(\d+)", link).group(1)
    page = _page(browser, base + link)  # the first line's "report": the parent's report.html artifact, shown in place
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    with page.context.expect_page() as opened:
        page.get_by_role("link", name="report", exact=True).first.click()
    shown = opened.value
    expect(shown).to_have_url(re.compile(re.escape(view.report_page(experiment_id, parent).split("?")[0])))
    report = shown.frame_locator("iframe").first
    expect(report.get_by_text(re.compile(rf"^Best: {best.data.tags['pipeline.setting']} \("))).to_be_visible(
        timeout=60_000
    )
    expect(report.locator("#settings tbody tr")).to_have_count(8)
    shown.close()
    page.close()


@pytest.mark.browser
def test_the_best_model_is_one_click_away_and_back_plus_one_click_restores_the_view(ui, browser):
    """The first line's "its model" opens the best setting's model (issue 32's pick, the parent's
    pipeline.best_run): one click. After a run page and Back the UI keeps the filter and sort but
    drops the view's columns (MLflow 3.17.2); the same line's "comparison view" brings them back in
    one click (a new tab, where the link is applied afresh)."""
    from playwright.sync_api import expect

    base, link, _, uri = ui
    client, parent, best = _best(uri, link)
    page = _page(browser, base + link)
    expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    model_id = best.outputs.model_outputs[-1].model_id
    with page.context.expect_page() as opened:
        page.get_by_role("link", name="its model").first.click()
    model = opened.value
    expect(model).to_have_url(re.compile(rf"/models/{model_id}"), timeout=30_000)
    expect(model.get_by_text(model_id).first).to_be_visible(timeout=60_000)
    model.close()

    experiment_id = re.search(r"experiments/(\d+)", link).group(1)  # a run page, as its link opens it
    page.goto(f"{base}#/experiments/{experiment_id}/runs/{best.info.run_id}?workflowType=machine_learning")
    expect(page.get_by_text(best.info.run_name).first).to_be_visible(timeout=60_000)
    page.go_back()
    expect(page.get_by_text("8 matching runs")).to_be_visible(timeout=30_000)  # filter and sort kept
    with page.context.expect_page() as opened:
        page.get_by_role("link", name="comparison view").first.click()
    again = opened.value
    expect(again.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
    expect(again.get_by_role("columnheader", name=re.compile("setting_steady_epoch_s")).first).to_be_visible()
    again.close()
    page.close()


@pytest.mark.slow  # a sweep ended by SIGTERM, run again with --register, then the UI (30-60 s on 2 cores)
@pytest.mark.browser
def test_an_interrupted_sweep_run_again_shows_whole_and_its_registered_model_says_so(
    tmp_path, data_dir, browser, _store_template
):
    """After a sweep ended inside its second point and the grid run again with `--register`: the
    printed link shows both settings (the DONE one under the earlier parent too) with the verdict on
    the first line, at 1024x768 and 1440x900; the first line's "its model" opens the registered
    model's page, which lists its version (MLflow's register_model links it)."""
    import subprocess

    import mlflow
    from playwright.sync_api import expect

    uri = new_store(tmp_path, _store_template)
    grid = tmp_path / "grid.yaml"
    grid.write_text("experiment: again\ngrid:\n  batch_size: [32, 512]\n  device: [cpu]\n  epochs: [1]\n")
    args = ["run", str(grid), "--data-dir", str(data_dir), "--tracking-uri", uri]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(END_BATCH_SIZE="512", END_AT="epoch", END_HOW="SIGTERM")
    ending = Path(__file__).with_name("ending_pipeline.py")
    ended = subprocess.run([sys.executable, str(ending), *args], env=env, capture_output=True, text=True, timeout=300)
    assert ended.returncode == 143, ended.stdout + ended.stderr
    again = invoke(*args, "--register", "again-cnn")
    assert again.exit_code == 0 and "1 of 2 runs are DONE points trained before" in again.output, again.output
    link = re.search(r"http://127\.0\.0\.1:5000/(#/experiments/\S+)", " ".join(again.output.split())).group(1)
    client, parent, best = _best(uri, link)
    version = client.get_model_version_by_alias("again-cnn", "champion")
    assert version.run_id == best.info.run_id  # the model the first line links is the one registered
    assert mlflow.MlflowClient(uri).get_run(parent).data.tags[view.NOTE_TAG]  # published

    port = free_port()
    server = start_service([sys.executable, "-m", "pipeline", "ui", "--port", str(port), "--tracking-uri", uri])
    try:
        base = f"http://127.0.0.1:{port}/"
        wait_for(f"{base}health", server)
        for width, height in ((1024, 768), (1440, 900)):
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(base + link)
            expect(page.get_by_text("You're viewing a shared view")).to_be_visible(timeout=60_000)
            expect(page.get_by_text("2 matching runs")).to_be_visible()
            names = page.locator(".ag-pinned-left-cols-container .ag-row").all_inner_texts()
            assert sorted(re.search(r"cpu bs\d+", name).group(0) for name in names) == ["cpu bs32", "cpu bs512"]
            right = _panel_left(page)
            _visible_left_of(page, page.get_by_role("link", name="its model", exact=True).first, right)
            verdict = re.compile(rf"^(Best|Most accurate): {best.data.tags['pipeline.setting']}[: ]")
            expect(page.get_by_text(verdict).first).to_be_attached()
            _keep(page, f"ui-again-{width}.png")
            if width == 1440:
                with page.context.expect_page() as opened:
                    page.get_by_role("link", name="its model", exact=True).first.click()
                model = opened.value
                expect(model.get_by_text("Model versions")).to_be_visible(timeout=60_000)
                expect(model.get_by_role("link", name=re.compile(r"^again-cnn")).first).to_be_visible()
                expect(model.get_by_text(f"v{version.version}", exact=True).first).to_be_visible()
                _keep(model, "ui-again-model.png")
                model.close()
            page.close()
    finally:
        stop_service(server)
