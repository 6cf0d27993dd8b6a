"""seeker's web UI (static/index.html, served at /) in headless Chromium.

Run by scripts/api-tests.sh against `cargo run --example api_server`: the real
server with a scripted policy (round 1 searches "Mona Lisa painter" on the
real index, round 2 answers "Leonardo da Vinci", or "Leonardo da Vinci [1]"
when asked to cite its sources; "search widely" writes four queries; "search
for nothing" searches a word no document holds; "think slowly" streams
reasoning for 30 s instead, after the question search of a prefetch profile or
after "search for nothing") and extra search backends `fixture` (documents
full of markup, scores 3.5, 2.25 and 1), `broken` (fails) and `empty` (no
documents). SEEKER_URL is the server root; SEEKER_KEY the API key it requires.
Needs Debian's chromium and chromium-driver (CHROMIUM and CHROMEDRIVER override
their paths). A screenshot of a finished two-round rollout is saved to
target/ui-artifacts/.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["SEEKER_URL"]
KEY = os.environ["SEEKER_KEY"]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "target" / "ui-artifacts"
WAIT_S = 10

# The fixture backend's first document (examples/api_server.rs).
MARKUP_TITLE = "<script>window.__seekerXss = 'script'; alert(1)</script>Mona Lisa <b>(markup)</b>"


@contextlib.contextmanager
def chromium():
    """Headless Chromium with a fresh profile (so nothing is cached), its console logged."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="seeker-ui-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--window-size=1000,1100",
        f"--user-data-dir={profile}",
    ]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser):
    """The UI, freshly loaded, with the API key stored as a user would type it."""
    browser.set_window_size(1000, 1100)
    browser.get(f"{URL}/")
    browser.execute_script("localStorage.setItem('seeker-key', arguments[0])", KEY)
    browser.get(f"{URL}/")
    # The policies come from /v1/models, which needs the key.
    wait(browser).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#policy option")) > 1)
    return browser


def wait(driver, seconds=WAIT_S):
    return WebDriverWait(driver, seconds)


def settings(driver, **fields):
    """Sets request settings by element id (policy is a <select>)."""
    driver.execute_script("document.getElementById('settings').open = true")
    for name, value in fields.items():
        element = driver.find_element(By.ID, name)
        if element.tag_name == "select":
            element.find_element(By.CSS_SELECTOR, f"option[value='{value}']").click()
        else:
            element.clear()
            element.send_keys(value)


def ask(driver, question):
    """Types the question and sends it with Enter, as a user would."""
    box = driver.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    box.send_keys(Keys.ENTER)


def finished(driver, turn=1):
    """Waits for turn `turn` to end; its state: done, stopped or error."""
    selector = f"#turn-{turn}[data-state]"
    wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, selector))
    return driver.find_element(By.CSS_SELECTOR, selector).get_attribute("data-state")


def texts(driver, selector):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def get(path):
    request = urllib.request.Request(f"{URL}{path}", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request) as r:
        return r.read().decode()


def metrics():
    return get("/metrics")


def record_requests(driver):
    """From now on window.__bodies collects the chat request bodies the page sends."""
    driver.execute_script("""
        window.__bodies = [];
        const original = window.fetch;
        window.fetch = function (url, options) {
          if (String(url).endsWith('/v1/chat/completions')) window.__bodies.push(JSON.parse(options.body));
          return original.apply(this, arguments);
        };
    """)


def metric(name, labels=""):
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" (\S+)$"
    for line in metrics().splitlines():
        m = re.match(pattern, line)
        if m:
            return float(m.group(1))
    return 0.0


def test_two_round_rollout_shows_searches_documents_and_a_cited_answer(page):
    ask(page, "Who painted the Mona Lisa? Cite your sources.")
    assert finished(page) == "done"
    rounds = page.find_elements(By.CSS_SELECTOR, "#turn-1 li.round")
    assert [r.get_attribute("data-round") for r in rounds] == ["1", "2"]
    search, answer_round = rounds

    # Round 1: the model's reasoning, its search call and the documents found.
    assert "I should look this up." in search.find_element(By.CSS_SELECTOR, ".reasoning-text").text
    assert search.find_element(By.CSS_SELECTOR, ".badge.outcome").text == "searched"
    assert texts(search, ".search-call .queries li") == ["Mona Lisa painter"]
    cards = search.find_elements(By.CSS_SELECTOR, ".query-card")
    assert len(cards) == 1
    assert "tantivy" in cards[0].find_element(By.CSS_SELECTOR, ".query-head").text
    titles = texts(cards[0], ".doc-title")
    assert len(titles) == 3 and titles[0] == "Mona Lisa", titles
    first = cards[0].find_element(By.CSS_SELECTOR, ".doc")
    assert re.search(r"score \d+\.\d\d · tantivy · id \S+", first.find_element(By.CSS_SELECTOR, ".doc-meta").text)
    assert "Mona Lisa" in first.find_element(By.CSS_SELECTOR, ".snippet").text
    # The spliced block is there too, as the model read it.
    splice = search.find_element(By.CSS_SELECTOR, "details.splice pre")
    assert '<information>Doc 1(Title: "Mona Lisa")' in splice.get_attribute("textContent")

    # Round 2 answers; the answer is shown apart from the reasoning.
    assert answer_round.find_element(By.CSS_SELECTOR, ".badge.outcome").text == "answered"
    assert "The documents say" not in page.find_element(By.CSS_SELECTOR, "#turn-1 .answer").text
    assert page.find_element(By.CSS_SELECTOR, "#turn-1 .answer").text == "Leonardo da Vinci [1]"

    # Footer: finish reason, tokens, rounds, time to first token, per-round timings.
    stats = page.find_element(By.CSS_SELECTOR, "#turn-1 .stats").get_attribute("textContent")
    assert "finishstop" in stats and "rounds2" in stats and "searches1" in stats
    assert re.search(r"tokens\d+ prompt \+ 9 generated = \d+", stats), stats
    assert re.search(r"first token[\d.<]+ m?s", stats), stats
    assert re.search(r"round 1: generation [\d.<]+ m?s · search [\d.<]+ m?s · 4 tokens", stats), stats

    # A screenshot of the finished rollout, the whole page: a test artifact
    # (and the picture in docs/api.md).
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = page.execute_script("return document.documentElement.scrollHeight")
    page.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                         {"width": 1000, "height": height, "deviceScaleFactor": 1, "mobile": False})
    path = ARTIFACTS / "two-round-rollout.png"
    try:
        assert page.save_screenshot(str(path)) and path.stat().st_size > 10_000
    finally:
        page.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    # The citation marker links to the card of the first document, and works.
    cite = page.find_element(By.CSS_SELECTOR, "#turn-1 .answer a.cite")
    assert cite.get_attribute("href").endswith("#turn-1-doc-1")
    page.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    cite.click()
    wait(page).until(lambda d: d.execute_script("return (document.querySelector(':target') || {}).id") == "turn-1-doc-1")
    target = page.find_element(By.ID, "turn-1-doc-1")
    assert target.find_element(By.CSS_SELECTOR, ".doc-title").text == "Mona Lisa"
    assert page.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return r.top >= 0 && r.top < innerHeight", target)

    # One numbered source chip per spliced document; the cited one is marked,
    # and chips work from the keyboard.
    chips = page.find_elements(By.CSS_SELECTOR, "#turn-1 .sources a.chip")
    assert [c.find_element(By.CSS_SELECTOR, ".t").text for c in chips] == titles
    assert "cited" in chips[0].get_attribute("class")
    assert "✓" in chips[0].text, "the Mona Lisa document names Leonardo da Vinci"
    page.execute_script("arguments[0].focus()", chips[2])
    chips[2].send_keys(Keys.ENTER)
    wait(page).until(lambda d: d.execute_script("return (document.querySelector(':target') || {}).id") == "turn-1-doc-3")


def test_settings_offer_what_the_server_serves_and_are_sent(page):
    model = json.loads(get("/v1/models"))["data"][0]
    assert {"tantivy", "fixture", "broken", "empty"} <= set(model["search_backends"])
    options = page.find_elements(By.CSS_SELECTOR, "#backend option")
    assert [o.get_attribute("value") for o in options] == ["", *model["search_backends"]]
    assert options[0].get_attribute("textContent") == "server default (tantivy)"
    assert model["default_search_backend"] == "tantivy"
    max_tokens = page.find_element(By.ID, "max-tokens")
    assert max_tokens.get_attribute("placeholder") == f"server default ({model['max_tokens']})"
    assert max_tokens.get_attribute("max") == str(model["max_tokens_limit"])

    # The backend chosen is the one the request names, and the one that answers.
    record_requests(page)
    settings(page, backend="fixture", **{"max-tokens": "300"})
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page) == "done"
    card = page.find_element(By.CSS_SELECTOR, "#turn-1 .query-card")
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "fixture"
    # Back to the server's default: the request names no backend, tantivy answers.
    settings(page, backend="", **{"max-tokens": ""})
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page, turn=2) == "done"
    card = page.find_element(By.CSS_SELECTOR, "#turn-2 .query-card")
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "tantivy"
    bodies = page.execute_script("return window.__bodies")
    assert bodies[0]["search"] == {"backend": "fixture"} and bodies[0]["max_tokens"] == 300
    assert "search" not in bodies[1] and "max_tokens" not in bodies[1]


def slow_rollout(driver, backend, turn=1):
    """Starts a rollout whose question search runs on `backend`, then the model
    thinks for 30 s; returns the question search's card once the thinking shows."""
    settings(driver, policy="search-r1-prefetch", backend=backend)
    ask(driver, "Think slowly: who painted the Mona Lisa?")
    wait(driver).until(lambda d: "Step 2." in d.find_element(
        By.CSS_SELECTOR, f"#turn-{turn} li.round[data-round='1'] .reasoning-text").text)
    assert not driver.find_elements(By.CSS_SELECTOR, f"#turn-{turn}[data-state]"), "the rollout still runs"
    return driver.find_element(By.CSS_SELECTOR, f"#turn-{turn} li.round[data-round='0'] .query-card")


def stop(driver, turn=1):
    driver.find_element(By.ID, "stop").click()
    assert finished(driver, turn) == "stopped"
    wait(driver, 5).until(lambda _: metric("seeker_requests_in_flight") == 0)


def test_documents_show_passage_score_and_backend_while_the_rollout_runs(page):
    record_requests(page)
    card = slow_rollout(page, "fixture")
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "fixture"
    metas = texts(card, ".doc-meta")
    snippets = texts(card, ".snippet")
    assert len(metas) == 3 and metas[0].startswith("score 3.50 · fixture · id fixture-1"), metas
    assert metas[1].startswith("score 2.25 · fixture · id fixture-2"), metas
    assert snippets[0].startswith("Leonardo da Vinci painted it. <img src=x"), snippets
    assert snippets[1] == "This document's URL runs script if it is made a link."
    assert page.execute_script("return window.__bodies")[0]["search"] == {"backend": "fixture"}

    stop(page)
    # What came live stays.
    assert texts(card, ".doc-meta") == metas and texts(card, ".snippet") == snippets


def test_failed_and_empty_searches_name_their_backend_while_the_rollout_runs(page):
    # Nothing found by the server's default backend, which the request did not name.
    ask(page, "Search for nothing, then think slowly.")
    wait(page).until(lambda d: "Step 2." in d.find_element(
        By.CSS_SELECTOR, "#turn-1 li.round[data-round='2'] .reasoning-text").text)
    assert not page.find_elements(By.CSS_SELECTOR, "#turn-1[data-state]"), "the rollout still runs"
    card = page.find_element(By.CSS_SELECTOR, "#turn-1 li.round[data-round='1'] .query-card")
    assert card.find_element(By.CSS_SELECTOR, ".q").text == "“zzqxv”"
    assert card.find_element(By.CSS_SELECTOR, ".no-results").is_displayed()
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "tantivy"
    stop(page)
    # A failure.
    card = slow_rollout(page, "broken", turn=2)
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "broken"
    assert "always fails" in card.find_element(By.CSS_SELECTOR, ".failure").text
    stop(page, turn=2)


def test_the_page_loads_without_console_errors():
    def icon_requests():
        return metric("seeker_http_request_duration_seconds_count", 'route="/favicon.ico"')

    before = icon_requests()
    # A fresh browser, which has asked this server for nothing yet.
    with chromium() as driver:
        driver.get(f"{URL}/health")
        driver.execute_script("localStorage.setItem('seeker-key', arguments[0])", KEY)
        driver.get(f"{URL}/")
        wait(driver).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#backend option")) > 1)
        # The browser asks for /favicon.ico (the page declares no icon); it needs no key.
        wait(driver).until(lambda _: icon_requests() > before)
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert not errors


def csp_violations(driver):
    """The browser's console messages about a Content Security Policy violation."""
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]


def test_the_ui_works_under_its_content_security_policy():
    # The headers a browser gets with the page (server.security_headers, on by default).
    with urllib.request.urlopen(f"{URL}/") as r:
        csp = r.headers["Content-Security-Policy"]
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Referrer-Policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp, csp
    with chromium() as driver:
        driver.get(f"{URL}/health")
        driver.execute_script("localStorage.setItem('seeker-key', arguments[0])", KEY)
        driver.get(f"{URL}/")
        wait(driver).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#policy option")) > 1)
        # A whole rollout: streaming, document cards, citation links, source chips.
        ask(driver, "Who painted the Mona Lisa? Cite your sources.")
        assert finished(driver) == "done"
        assert driver.find_element(By.CSS_SELECTOR, "#turn-1 .answer").text == "Leonardo da Vinci [1]"
        driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
        driver.find_element(By.CSS_SELECTOR, "#turn-1 .answer a.cite").click()
        assert not csp_violations(driver)
        # The policy is enforced: code the page did not ship is refused, and said so.
        driver.execute_script("""
            const s = document.createElement('script');
            s.textContent = 'window.__injected = true';
            document.body.append(s);
        """)
        assert driver.execute_script("return window.__injected === undefined")
        assert any("script-src" in m for m in csp_violations(driver))


def test_swagger_ui_works_under_its_content_security_policy():
    with chromium() as driver:
        driver.get(f"{URL}/docs/")
        wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"))
        assert "seeker" in driver.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text.lower()
        # Open one operation and run it ("Try it out" calls the server from the page).
        wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#operations-openai-models"))
        driver.find_element(By.CSS_SELECTOR, "#operations-openai-models .opblock-summary").click()
        wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".try-out__btn")).__getitem__(0).click()
        wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".execute")).__getitem__(0).click()
        # Keys are required: the server's 401 comes back into the page.
        wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status"))
        status = driver.find_element(By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status").text
        assert "401" in status, status
        assert not csp_violations(driver)


def test_document_markup_is_shown_as_text_and_runs_nothing(page):
    settings(page, backend="fixture")
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page) == "done"
    titles = texts(page, "#turn-1 .doc-title")
    assert titles[0] == MARKUP_TITLE
    assert titles[2] == "\"><svg onload=\"window.__seekerXss = 'svg'\"></svg>"
    snippets = texts(page, "#turn-1 .snippet")
    assert "<img src=x onerror=\"window.__seekerXss = 'img'\">" in snippets[0]
    assert "<iframe src=" in snippets[2]
    splice = page.find_element(By.CSS_SELECTOR, "#turn-1 details.splice pre").get_attribute("textContent")
    assert MARKUP_TITLE in splice

    # Nothing was parsed as HTML and nothing ran.
    with pytest.raises(NoAlertPresentException):
        page.switch_to.alert.text
    assert page.execute_script("return window.__seekerXss") is None
    parsed = page.execute_script(
        "return document.querySelectorAll('#conversation :is(script, img, svg, iframe, b)').length")
    assert parsed == 0
    # Only http(s) URLs become links.
    links = [a.get_attribute("href") for a in page.find_elements(By.CSS_SELECTOR, "#turn-1 a.doc-title")]
    assert links == ["https://example.org/mona-lisa?a=1&b=%3Cx%3E"]
    assert page.find_element(By.CSS_SELECTOR, "#turn-1 a.doc-title").get_attribute("rel") == "noopener noreferrer nofollow"
    assert not page.find_elements(By.CSS_SELECTOR, "a[href^='javascript:' i]")
    metas = texts(page, "#turn-1 .doc-meta")
    assert "URL not linked (not http or https): javascript:window.__seekerXss = 'url'" in metas[1]

    # Control: the same text given to innerHTML is parsed, so the count above can
    # fail; its handler does not run either, because the page's
    # Content-Security-Policy refuses inline handlers (and says so).
    page.execute_script(
        "const d = document.createElement('div'); $('conversation').append(d); d.innerHTML = arguments[0]",
        snippets[0])
    assert page.execute_script("return document.querySelectorAll('#conversation img').length") == 1
    wait(page).until(lambda d: any("inline event handler" in m for m in csp_violations(d)))
    assert page.execute_script("return window.__seekerXss") is None


def test_failures_and_empty_results_are_shown_as_such(page):
    settings(page, backend="broken")
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page) == "done"
    card = page.find_element(By.CSS_SELECTOR, "#turn-1 .query-card")
    assert "failed" in texts(card, ".badge")
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "broken"
    failure = card.find_element(By.CSS_SELECTOR, ".failure").text
    assert failure.startswith("Search failed (backend):") and "always fails" in failure, failure
    assert not card.find_elements(By.CSS_SELECTOR, ".doc")
    assert "search failed" in page.find_element(By.CSS_SELECTOR, "#turn-1 details.splice pre").get_attribute("textContent")

    page.find_element(By.ID, "new-chat").click()
    settings(page, backend="empty")
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page, turn=2) == "done"
    card = page.find_element(By.CSS_SELECTOR, "#turn-2 .query-card")
    assert card.find_element(By.CSS_SELECTOR, ".no-results").text.startswith("No results")
    assert card.find_element(By.CSS_SELECTOR, ".badge.backend").text == "empty"
    assert not page.find_elements(By.CSS_SELECTOR, "#turn-2 .failure")
    assert not page.find_elements(By.CSS_SELECTOR, "#turn-2 .sources a.chip")


def test_request_errors_are_shown_with_their_code(page):
    settings(page, **{"top-k": "0"})
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page) == "error"
    error = page.find_element(By.CSS_SELECTOR, "#turn-1 .error").text
    assert "HTTP 400" in error and "invalid_value: search.top_k must be between 1 and 50" in error, error
    assert not page.find_element(By.CSS_SELECTOR, "#turn-1 .answer-box").is_displayed()
    # The question is back in the box, to fix the setting and send again.
    assert page.find_element(By.ID, "question").get_attribute("value") == "Who painted the Mona Lisa?"
    settings(page, **{"top-k": "1"})
    page.find_element(By.ID, "send").click()
    assert finished(page, turn=2) == "done"
    assert len(page.find_elements(By.CSS_SELECTOR, "#turn-2 .doc")) == 1


def test_a_multi_query_call_shows_its_notes_and_one_card_per_query(page):
    settings(page, policy="rag-r1-mq")
    ask(page, "Search widely: who painted the Mona Lisa?")
    assert finished(page) == "done"
    search = page.find_element(By.CSS_SELECTOR, "#turn-1 li.round[data-round='1']")
    assert texts(search, ".search-call .queries li") == ["Mona Lisa painter", "zzqxv", "Louvre museum"]
    notes = texts(search, ".search-call .notes li")
    assert len(notes) == 1 and notes[0].startswith("cleaning: kept the first 3 of 4 queries"), notes
    cards = search.find_elements(By.CSS_SELECTOR, ".query-card")
    assert [c.find_element(By.CSS_SELECTOR, ".q").text for c in cards] == ["“Mona Lisa painter”", "“zzqxv”", "“Louvre museum”"]
    assert len(cards[0].find_elements(By.CSS_SELECTOR, ".doc")) == 3
    assert cards[1].find_element(By.CSS_SELECTOR, ".no-results").is_displayed()
    assert not cards[1].find_elements(By.CSS_SELECTOR, ".doc")
    # The backend that found nothing is named, though the request named none.
    assert [c.find_element(By.CSS_SELECTOR, ".badge.backend").text for c in cards] == ["tantivy"] * 3
    assert texts(cards[2], ".doc-title")[0] == "Louvre"
    # A document found by two queries keeps its number; links go to its first card.
    first = {d.find_element(By.CSS_SELECTOR, ".doc-title").text: d for d in cards[0].find_elements(By.CSS_SELECTOR, ".doc")}
    again = cards[2].find_element(By.CSS_SELECTOR, ".doc")
    assert "Louvre" in first, list(first)
    number = first["Louvre"].find_element(By.CSS_SELECTOR, ".doc-num").text
    assert again.find_element(By.CSS_SELECTOR, ".doc-num").text == number
    assert first["Louvre"].get_attribute("id") == f"turn-1-doc-{number.strip('[]')}" and not again.get_attribute("id")
    assert page.find_element(By.CSS_SELECTOR, "#turn-1 .answer").text == "Leonardo da Vinci"


def test_the_question_search_of_a_prefetch_profile_is_labelled(page):
    settings(page, policy="search-r1-prefetch", **{"top-k": "2"})
    ask(page, "Who painted the Mona Lisa")
    assert finished(page) == "done"
    rounds = page.find_elements(By.CSS_SELECTOR, "#turn-1 li.round")
    assert [r.get_attribute("data-round") for r in rounds] == ["0", "1", "2"]
    question = rounds[0]
    assert question.find_element(By.CSS_SELECTOR, "h3").text == "Question search"
    assert "search-r1-prefetch policy searches the question itself" in question.text
    assert texts(question, ".search-call .queries li") == ["Who painted the Mona Lisa?"]
    assert len(question.find_elements(By.CSS_SELECTOR, ".doc")) == 2, "top-k 2"
    assert texts(rounds[1], ".search-call .queries li") == ["Mona Lisa painter"]
    assert "policysearch-r1-prefetch" in page.find_element(By.CSS_SELECTOR, "#turn-1 .stats").get_attribute("textContent")


def test_stop_cancels_the_rollout_on_the_server(page):
    disconnects = metric("seeker_client_disconnects_total", 'phase="decode"')
    ask(page, "Think slowly: who painted the Mona Lisa?")
    wait(page).until(lambda d: "Step 3." in d.find_element(By.CSS_SELECTOR, "#turn-1 .reasoning-text").text)
    assert metric("seeker_requests_in_flight") == 1
    page.find_element(By.ID, "stop").click()
    assert finished(page) == "stopped"
    assert "Stopped" in page.find_element(By.CSS_SELECTOR, "#turn-1 .stopped").text
    assert page.find_element(By.CSS_SELECTOR, "#turn-1 .round .badge.outcome").text == "stopped"
    # The server noticed: the request is gone and counted as a client that left.
    wait(page, 5).until(lambda _: metric("seeker_requests_in_flight") == 0)
    wait(page, 5).until(lambda _: metric("seeker_client_disconnects_total", 'phase="decode"') == disconnects + 1)
    assert page.find_element(By.ID, "send").is_enabled()
    assert not page.find_element(By.ID, "stop").is_enabled()


def test_multi_turn_sends_the_earlier_turns_and_copies_them(page):
    record_requests(page)
    page.execute_script("""
        window.__copied = [];
        Object.defineProperty(navigator.clipboard, 'writeText',
          {value: (text) => { window.__copied.push(text); return Promise.resolve(); }});
    """)
    ask(page, "Who painted the Mona Lisa?")
    assert finished(page) == "done"
    ask(page, "And who painted the Last Supper?")
    assert finished(page, turn=2) == "done"
    bodies = page.execute_script("return window.__bodies")
    assert len(bodies) == 2
    assert bodies[0]["messages"] == [{"role": "user", "content": "Who painted the Mona Lisa?"}]
    assert bodies[1]["messages"] == [
        {"role": "user", "content": "Who painted the Mona Lisa?"},
        {"role": "assistant", "content": "Leonardo da Vinci"},
        {"role": "user", "content": "And who painted the Last Supper?"},
    ]
    assert bodies[1]["stream"] is True and bodies[1]["return_transcript"] is True
    # The second turn's query was answered from the server's shared cache.
    assert "cached" in texts(page, "#turn-2 .query-card .badge")

    page.find_element(By.ID, "copy-transcript").click()
    wait(page).until(lambda d: len(d.execute_script("return window.__copied")) == 1)
    transcript = page.execute_script("return window.__copied[0]")
    assert "You: Who painted the Mona Lisa?" in transcript
    assert "You: And who painted the Last Supper?" in transcript
    assert transcript.count("Answer: Leonardo da Vinci") == 2
    assert "<search> Mona Lisa painter </search>" in transcript

    page.find_element(By.ID, "copy-curl").click()
    wait(page).until(lambda d: len(d.execute_script("return window.__copied")) == 2)
    curl = page.execute_script("return window.__copied[1]")
    assert curl.startswith(f"curl -N '{URL}/v1/chat/completions'")
    assert '"Authorization: Bearer $SEEKER_API_KEY"' in curl and KEY not in curl
    body = json.loads(re.search(r"-d '(.*)'\n$", curl, re.S).group(1))
    assert body == bodies[1]


def test_phone_width_has_no_sideways_scrolling(page):
    page.set_window_size(390, 844)
    settings(page, backend="fixture")
    page.execute_script("document.getElementById('settings').open = false")
    ask(page, "Who painted the Mona Lisa? Cite your sources.")
    assert finished(page) == "done"
    overflow = page.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    assert page.find_element(By.CSS_SELECTOR, "#turn-1 .answer").is_displayed()
