"""`seeker report`'s page (report.html) in headless Chromium.

Run by scripts/api-tests.sh: writes two small `seeker eval --out` runs (one
set-answer question set with hops, two policies that differ on half the
questions), makes their report with the seeker binary (SEEKER_BIN, default
target/debug/seeker), opens report.html from disk with the network cut off, and
checks that every plot renders: an inline SVG with a size, bars or lines, the
runs' names in its legend, and nothing fetched. A screenshot lands in
target/ui-artifacts/eval-report.png.
"""

import json
import os
import subprocess
import tempfile
from pathlib import Path

from selenium.webdriver.common.by import By

from test_web_ui import ARTIFACTS, chromium

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get(
    "SEEKER_BIN",
    str(Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "seeker"),
)


def write_run(dir: Path, name: str, policy: str, scores: list) -> Path:
    path = dir / f"{name}.jsonl"
    lines = []
    for i, score in enumerate(scores):
        lines.append(json.dumps({
            "id": f"q{i}", "question": f"question {i}", "golds": ["a"], "prediction": "a",
            "set_f1": score, "em": 1.0 if score == 1.0 else 0.0, "difficulty": 1 + i % 3,
            "searches": i % 3, "queries": i % 3, "answer_in_documents": score > 0,
            "support_recall": score, "seconds": 2.0 + i,
        }))
    path.write_text("\n".join(lines) + "\n")
    (dir / f"{name}.summary.json").write_text(
        json.dumps({"config": {"policy": policy, "backend": "tantivy"}}))
    return path


def test_the_report_page_renders_every_plot_offline():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        a = write_run(tmp, "a", "search-r1", [1.0, 0.0, 0.5, 1.0, 0.0, 0.0])
        b = write_run(tmp, "b", "tool-search", [1.0, 1.0, 0.5, 1.0, 1.0, 0.0])
        out = tmp / "report"
        subprocess.run([BIN, "report", "--out", str(out), str(a), str(b)], check=True)
        files = sorted(p.name for p in out.iterdir())
        assert files == ["by_difficulty.svg", "compare.svg", "latency.svg", "report.html",
                         "scores.svg", "searches.svg"]
        with chromium() as driver:
            driver.set_window_size(900, 1200)
            # Offline: a page that needed the network would fail to load it.
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.emulateNetworkConditions", {
                "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
            driver.get((out / "report.html").as_uri())
            figures = driver.find_elements(By.CSS_SELECTOR, "figure")
            assert [f.get_attribute("id") for f in figures] == [
                "scores", "by_difficulty", "searches", "latency", "compare"]
            for figure in figures:
                svg = figure.find_element(By.TAG_NAME, "svg")
                size = svg.size
                assert size["width"] > 300 and size["height"] > 200, (figure.get_attribute("id"), size)
                marks = driver.execute_script(
                    "return arguments[0].querySelectorAll('rect, polyline, path, circle').length", svg)
                assert marks > 10, (figure.get_attribute("id"), marks)
            legend = figures[0].text
            assert "search-r1 · tantivy" in legend and "tool-search · tantivy" in legend, legend
            body = driver.find_element(By.TAG_NAME, "body").text
            # b scores higher on q1 and q4; the rest are the same.
            assert "tool-search · tantivy higher on 2, the same on 4" in body, body
            resources = driver.execute_script(
                "return performance.getEntriesByType('resource').map(e => e.name)")
            assert resources == [], resources
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "eval-report.png"))
