"""Re-take the README's UI screenshots: `python docs/screenshots.py LINK [OUT_DIR]`.

LINK is the one `pipeline run` or `pipeline ui` printed (the UI must be running). Uses Debian's
chromium through Playwright, as tests/test_ui.py does; OUT_DIR defaults to docs/.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright


def main(link: str, out: Path) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        for mode, name in (("TABLE", "ui-table.png"), ("CHART", "ui-charts.png")):
            page.goto(link.replace("compareRunsMode=TABLE", f"compareRunsMode={mode}"))
            page.get_by_text("You're viewing a shared view").wait_for(timeout=60_000)
            close = page.get_by_role("button", name="Close")  # MLflow's assistant panel, shown on a first visit
            if close.count():
                close.first.click()
            page.wait_for_timeout(3000)  # the charts draw after the data arrives
            page.screenshot(path=str(out / name))
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent)
