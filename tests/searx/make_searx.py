#!/usr/bin/env python3
"""Builds a fully offline searx instance over a seeker corpus, for the tests.

usage: make_searx.py CORPUS.jsonl OUT_DIR PORT

Writes OUT_DIR/corpus.db (SQLite table `docs(title, url, content)`, one row
per corpus line) and OUT_DIR/settings.yml: searx on 127.0.0.1:PORT with the
JSON format on and one engine, searx's `sqlite` offline engine, matching rows
whose title or content contains the query (LIKE). Start it with
`SEARX_SETTINGS_PATH=OUT_DIR/settings.yml searx-run` (Debian package `searx`).
"""
import json
import os
import sqlite3
import sys


def main():
    corpus, out, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    db = os.path.join(out, "corpus.db")
    if os.path.exists(db):
        os.remove(db)
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE docs (title TEXT, url TEXT, content TEXT)")
    with open(corpus, encoding="utf-8") as f:
        rows = []
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            url = "https://en.wikipedia.org/wiki/" + d["title"].replace(" ", "_")
            rows.append((d["title"], url, d["text"]))
    con.executemany("INSERT INTO docs VALUES (?, ?, ?)", rows)
    con.commit()
    con.close()
    settings = f"""\
use_default_settings: false
general:
  debug: false
  instance_name: "seeker-test"
  enable_stats: false
search:
  safe_search: 0
  autocomplete: ""
  default_lang: ""
  formats: [html, json]
  ban_time_on_fail: 0
  max_ban_time_on_fail: 0
server:
  port: {port}
  bind_address: "127.0.0.1"
  secret_key: "seeker-test-only-{os.getpid()}"
  base_url: false
  image_proxy: false
  http_protocol_version: "1.0"
  method: "GET"
  default_http_headers: {{}}
ui:
  static_path: "/usr/share/python3-searx/static"
  templates_path: "/usr/share/python3-searx/templates"
  default_theme: oscar
  default_locale: ""
  theme_args:
    oscar_style: logicodev
outgoing:
  request_timeout: 5.0
  useragent_suffix: ""
  pool_connections: 10
  pool_maxsize: 10
engines:
  - name: corpus
    engine: sqlite
    shortcut: corpus
    categories: general
    database: "{db}"
    query_str: "SELECT title, url, content FROM docs WHERE title LIKE '%' || :query || '%' OR content LIKE '%' || :query || '%' ORDER BY (title LIKE '%' || :query || '%') DESC, length(content)"
    limit: 10
    disabled: false
locales:
  en: English
doi_resolvers:
  oadoi.org: 'https://oadoi.org/'
default_doi_resolver: 'oadoi.org'
"""
    with open(os.path.join(out, "settings.yml"), "w", encoding="utf-8") as f:
        f.write(settings)


if __name__ == "__main__":
    main()
