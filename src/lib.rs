//! seeker: an OpenAI-compatible inference server for search-augmented reasoning
//! policies (Search-R1, RAG-R1, R1-Searcher and models like them).
//!
//! The policy generates text; seeker watches it for search calls, runs the
//! queries against a search backend, splices the documents back in the exact
//! format the policy was trained on, and continues, streaming the reasoning,
//! the searches and the answer to the client.
//!
//! # Layout
//!
//! A request's path, top to bottom: `main` → [`startup`] → [`server`] →
//! [`eval`] → [`rollout`] → [`profile`] → [`scanner`] / [`toolcall`] →
//! [`engine`] → [`search`] → [`pages`] → [`config`] → [`metrics`] → [`chat`] /
//! [`template`] / [`pyjson`] → [`secret`] / [`tempfiles`]. Imports go down
//! that order, or stay in a module's own layer; a test (`layout` in this
//! file) fails for any other, but for the two that go up today: [`config`]
//! builds the search and page settings it validates. The same test fails
//! when two files of one module import each other, but for four pairs it
//! lists (`engine::{chat_template, checkpoint}`, `eval::{page, report}`,
//! `eval::{plot, report}`, `search::{dense, dense_build}`).
//!
//! - [`startup`]: the composition root: config → profiles, dispatcher, HTTP
//!   state, listener, the engine (embedded, loaded in the background, or
//!   remote); signals. [`logging`]: the binary's log setup.
//! - [`server`]: the HTTP surface (axum), one file per step: `listen`
//!   (connections, `idle` their deadline) → `ops` (keys, limits, per-route
//!   metrics) → `json` (the body) → `validate` (with `tools`) → `chat` /
//!   `retrieve` → `render` (chunks, responses); `responses` (the Responses
//!   API over the same rollout: `input` its input items, `convert` its tools
//!   and options, `types` its wire types, `render` its output and events), `mcp` (the MCP
//!   server), `citations` (`url_citation`s of an answer), `observe`
//!   (per-request metrics from a rollout's events), `headers` (security
//!   headers), `hosts` (the `Host` and `Origin` check of every route);
//!   `state`, `error`, `openai` (wire types: `request` what a
//!   client sends, `response` the completion and its chunks), `api_doc`
//!   (OpenAPI).
//! - [`rollout`]: the search loop of one request: `prompt` (the first
//!   prompt), then round by round `decide` (what a round's end means, pure)
//!   carried out by `round` and `search` (its queries at once, pages,
//!   splices); `resume` (a client's transcript continued), `answer` (the
//!   streamed answer, `stop` strings), `types` (requests, events, outcomes).
//! - [`profile`]: policy profiles (`config/policies/*.toml`): `load` (loading
//!   and validation), `schema` (the TOML schema), `text` (prompt, queries,
//!   splices, `defuse`) and `tools` (tool calls' queries and responses).
//!   Data, not code.
//! - [`scanner`]: the tag scanner, a pure state machine over generated text.
//! - [`toolcall`]: tool calls in a finished turn (`<tool_call>` JSON, fenced
//!   or bare call objects), a pure function for tool-calling profiles.
//! - [`template`]: the `{field}` templates profiles are written in.
//! - [`pyjson`]: Python's `json.dumps` and `repr()` byte for byte (RAG-R1's
//!   splice, chat templates' `tojson`, DeepResearcher's tool results).
//! - [`engine`]: the [`engine::Engine`] trait (`generate`, `healthy`);
//!   `text` (above it: the policy's chat template, control tokens and token
//!   count, shared by all engines); `chat_template` (the model's
//!   template, rendered by seeker for every engine); the embedded mistral.rs
//!   engine (the `embedded` feature, on by default: `mistral`: `load`,
//!   `reuse_state`, `stream`, `probe`; with
//!   `prepare` for weight copies, `reuse` for prefix
//!   reuse and its sentinel, `continued` for rounds continued by token ids,
//!   `vocab` for the model's vocabulary, `checkpoint` for a Hugging Face
//!   checkpoint directory and its in-situ quantization); `remote` (inference servers:
//!   `pool` for replicas and their health, `request` for requests and
//!   failover, `stream` and `wire` for their streams, `tokens` for rounds as
//!   token ids); `gate` (engine slots, oldest rollout first) and `scripted`
//!   (a replaying engine for tests).
//! - [`search`]: the [`search::SearchBackend`] trait; `dispatch` (every query of
//!   a round at once: limits, retries, shared cache; `lists` the `fallback` and
//!   `merge` backend lists), `bm25` (the local tantivy
//!   index; `build` builds it), `dense` (dense retrieval, `dense_build` builds it, with `embed` for the encoder and
//!   `signbits` for the approximate search of large indexes), `hybrid` (BM25 and dense fused by rank), `web` (the web
//!   providers, one module each: `brave`, `tavily`, `serper`, `exa`, `google`,
//!   `bing`, `searxng`), the
//!   retriever protocols `retriever` (Search-R1 `/retrieve`), `flashrag`
//!   (`/search`, `/batch_search`) and `r1searcher` (`/queries`), `clean`
//!   (snippet clean-up), `setup` (from config).
//! - [`pages`]: page actions: `guard` (what may be fetched: schemes, hosts,
//!   every resolved address), `reader` (fetch, cache), `corpus` (corpus
//!   documents by id or title: a trait the BM25 index implements),
//!   `extract` (readable text of HTML) and `shape` (a page's depth and size
//!   before parsing; flat text of one too deep to parse).
//! - [`metrics`]: every Prometheus metric, one registry per server.
//! - [`config`]: the typed configuration (`config/seeker.toml`, env, flags),
//!   one file per section (`server`, `model`, `search`, `pages`, `policy`),
//!   each checking itself; `env` for `SEEKER_*`.
//! - [`eval`]: `seeker eval`: `dataset` loading, EM / cover-EM / F1, set F1
//!   and retrieval recall (`metrics`), the run itself (`job`), the summary
//!   and its tables by difficulty and template (`summary`), `seeker
//!   report`'s page and plots (`report`, drawn by `plot`, the page in
//!   `page`).
//! - [`chat`]: a conversation's messages (`ChatTurn`, `Role`), beneath the
//!   HTTP layer, profiles and engines alike.
//! - [`tempfiles`]: removal of temporary files that stopped processes left.
//! - [`secret`]: API keys that `Debug` prints as `[redacted]`.
//!
//! The protocols the code relies on, with their sources, are in
//! `docs/protocols.md`.

pub mod chat;
pub mod config;
pub mod engine;
pub mod eval;
pub mod logging;
pub mod metrics;
pub mod pages;
pub mod profile;
pub mod pyjson;
pub mod rollout;
pub mod scanner;
pub mod search;
pub mod secret;
pub mod server;
pub mod startup;
pub mod tempfiles;
pub mod template;
pub mod toolcall;

#[cfg(test)]
mod layout {
    //! `docs/layout.md` and this file's Layout name every source file, so
    //! that a newcomer finds the file for each step from them; every link of
    //! the README, `docs/` and `bench/README.md` resolves; the README stays a
    //! front door.

    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src/ reads") {
            let path = entry.expect("entry reads").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The bullet of `list` (items begin with `marker`) that holds `key`.
    fn bullet<'a>(list: &'a str, marker: &str, key: &str) -> &'a str {
        list.split(marker)
            .find(|item| item.contains(key))
            .unwrap_or("")
    }

    #[test]
    fn layout_doc_and_lib_docs_name_every_source_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let section =
            std::fs::read_to_string(root.join("docs/layout.md")).expect("docs/layout.md reads");
        let section = section.as_str();
        let docs: String = include_str!("lib.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| l.trim_start_matches("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        let mut missing = Vec::new();
        for file in &files {
            let rel = file.strip_prefix(root.join("src")).expect("under src/");
            let parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let name = parts.last().unwrap().as_str();
            let top = parts[0].trim_end_matches(".rs");
            if name == "lib.rs" {
                continue;
            }
            // A top-level module (`src/x.rs`, `src/x/mod.rs`) is named as
            // `src/x.rs` or `src/x/` anywhere in docs/layout.md and as [`x`] in
            // lib.rs (`main` as `main`); a file below it, within the bullet
            // of `src/x/` and of [`x`], as `name.rs` (`dir/` for a `mod.rs`)
            // and `name`.
            let (readme_ok, docs_ok) = if parts.len() == 1 || (parts.len() == 2 && name == "mod.rs")
            {
                let path = if parts.len() == 1 {
                    format!("`src/{name}`")
                } else {
                    format!("`src/{top}/`")
                };
                let module = if top == "main" {
                    "`main`".to_string()
                } else {
                    format!("[`{top}`]")
                };
                (section.contains(&path), docs.contains(&module))
            } else {
                let (in_readme, module) = match name {
                    "mod.rs" => (
                        format!("`{}/`", parts[parts.len() - 2]),
                        parts[parts.len() - 2].clone(),
                    ),
                    _ => (
                        format!("`{name}`"),
                        name.trim_end_matches(".rs").to_string(),
                    ),
                };
                let readme_bullet = bullet(section, "\n- ", &format!("`src/{top}/`"));
                let docs_bullet = bullet(&docs, "\n - ", &format!("[`{top}`]:"));
                (
                    readme_bullet.contains(&in_readme),
                    docs_bullet.contains(&format!("`{module}`")),
                )
            };
            if !readme_ok {
                missing.push(format!("docs/layout.md lacks {}", rel.display()));
            }
            if !docs_ok {
                missing.push(format!("lib.rs Layout lacks {}", rel.display()));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// The library's layers, top (0) to bottom: a module imports modules of its
    /// own layer or below (Layout above). `main` is the binary's.
    const LAYERS: &[(&str, u8)] = &[
        ("startup", 0),
        ("logging", 0),
        ("server", 1),
        ("eval", 2),
        ("rollout", 3),
        ("profile", 4),
        ("scanner", 5),
        ("toolcall", 5),
        ("engine", 6),
        ("search", 7),
        ("pages", 8),
        ("config", 9),
        ("metrics", 10),
        ("chat", 11),
        ("template", 11),
        ("pyjson", 11),
        ("secret", 12),
        ("tempfiles", 12),
    ];

    /// The imports that go up today, each with what it names. The test fails
    /// for an upward import not listed here, and for a listed one that is
    /// gone (then strike it): the list only shrinks.
    const UPWARD: &[(&str, &str, &str)] = &[
        (
            "config",
            "search",
            "config/search.rs builds the dispatcher's, encoder's, dense and hybrid settings and lists the web providers",
        ),
        (
            "config",
            "pages",
            "config/pages.rs builds the page reader's settings",
        ),
    ];

    /// The first name of every path in `line` that starts with `prefix`
    /// (`crate::`, `super::`), grouped imports read item by item.
    fn names_after(line: &str, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = line;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // The first name of each item at the group's own depth.
                let (mut depth, mut item_start) = (1, true);
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ',' if depth == 1 => item_start = true,
                        c if item_start && depth == 1 && (c.is_alphanumeric() || c == '_') => {
                            let name: String = group[i..]
                                .chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect();
                            out.push(name);
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                out.push(
                    rest.chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect(),
                );
            }
        }
        out
    }

    /// Issue 51's one-way layers: no module imports a layer above its own but
    /// for the listed [`UPWARD`] imports.
    #[test]
    fn imports_go_down_the_layers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let rank = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, r)| *r);
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        let mut found = std::collections::BTreeMap::<(String, String), String>::new();
        for file in &files {
            let rel = file.strip_prefix(root.join("src")).expect("under src/");
            let top = rel.iter().next().unwrap().to_string_lossy();
            let top = top.trim_end_matches(".rs");
            if top == "main" || top == "lib" {
                continue;
            }
            let from = rank(top).unwrap_or_else(|| panic!("{top} has no layer in LAYERS"));
            let text = std::fs::read_to_string(file).expect("source reads");
            for (n, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                for module in names_after(code, "crate::") {
                    let to =
                        rank(&module).unwrap_or_else(|| panic!("{module} has no layer in LAYERS"));
                    if to < from {
                        found
                            .entry((top.to_string(), module))
                            .or_insert_with(|| format!("{}:{}", rel.display(), n + 1));
                    }
                }
            }
        }
        let mut wrong = Vec::new();
        for ((from, to), at) in &found {
            if !UPWARD.iter().any(|(f, t, _)| f == from && t == to) {
                wrong.push(format!("{at}: {from} imports {to}, a layer above it"));
            }
        }
        for (from, to, what) in UPWARD {
            if !found.contains_key(&(from.to_string(), to.to_string())) {
                wrong.push(format!(
                    "{from} no longer imports {to} ({what}): strike it from UPWARD"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// The pairs of files that import each other today, each with what the
    /// two share; like [`UPWARD`], the list only shrinks.
    const CIRCLES: &[(&str, &str, &str)] = &[
        (
            "engine::chat_template",
            "engine::checkpoint",
            "a checkpoint's template parts are read by checkpoint.rs and checked by chat_template.rs, which reads both sources",
        ),
        (
            "eval::page",
            "eval::report",
            "the report's runs and numbers, and the page that shows them",
        ),
        (
            "eval::plot",
            "eval::report",
            "the report's error type, which the plots return",
        ),
        (
            "search::dense",
            "search::dense_build",
            "the dense index's manifest and files, written by the build and read by the index",
        ),
    ];

    /// No two files of one module import each other (`super::x` from a file
    /// beside `x.rs`, or its `crate::` path): such a pair is one job split in
    /// two, or a type in the wrong file. A module's `mod.rs` and its children
    /// are parent and child, not a pair.
    #[test]
    fn no_two_files_of_a_module_import_each_other() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let mut edges = std::collections::BTreeSet::<(String, String)>::new();
        for file in &files {
            let rel = file.strip_prefix(&root).expect("under src/");
            let name = rel.file_stem().unwrap().to_string_lossy().into_owned();
            let Some(dir) = rel.parent().filter(|d| !d.as_os_str().is_empty()) else {
                continue;
            };
            if name == "mod" {
                continue;
            }
            let dir = dir.to_string_lossy().replace('/', "::");
            let text = std::fs::read_to_string(file).expect("source reads");
            let own = format!("crate::{dir}::");
            let code = text
                .lines()
                .map(str::trim_start)
                .take_while(|l| *l != "#[cfg(test)]")
                .filter(|l| !l.starts_with("//"));
            for line in code {
                for sibling in names_after(line, "super::")
                    .into_iter()
                    .chain(names_after(line, &own))
                {
                    if sibling != "super" && sibling != name {
                        edges.insert((format!("{dir}::{name}"), format!("{dir}::{sibling}")));
                    }
                }
            }
        }
        let circles: Vec<(String, String)> = edges
            .iter()
            .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
            .cloned()
            .collect();
        let mut wrong: Vec<String> = circles
            .iter()
            .filter(|(a, b)| !CIRCLES.iter().any(|(x, y, _)| x == a && y == b))
            .map(|(a, b)| format!("{a} and {b} import each other"))
            .collect();
        for (a, b, what) in CIRCLES {
            if !circles.contains(&(a.to_string(), b.to_string())) {
                wrong.push(format!(
                    "{a} and {b} no longer import each other ({what}): strike them from CIRCLES"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn crate_paths_are_read_from_plain_and_grouped_imports() {
        assert_eq!(
            names_after("use crate::engine::Engine;", "crate::"),
            ["engine"]
        );
        assert_eq!(
            names_after(
                "use crate::{chat::ChatTurn, search::{dense, Document}, metrics};",
                "crate::"
            ),
            ["chat", "search", "metrics"]
        );
        assert_eq!(
            names_after(
                "let x = crate::pages::PageSettings { a: crate::config::B };",
                "crate::"
            ),
            ["pages", "config"]
        );
    }

    /// Issue 29's bound: a source file holds one job, at most 600 lines of
    /// code before its test module (the first `#[cfg(test)]` followed by a
    /// `mod` line).
    #[test]
    fn no_source_file_is_over_600_lines_before_its_tests() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        let mut long = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("source reads");
            let lines: Vec<&str> = text.lines().collect();
            let code = lines
                .windows(2)
                .position(|w| w[0] == "#[cfg(test)]" && w[1].starts_with("mod "))
                .unwrap_or(lines.len());
            if code > 600 {
                long.push(format!("{}: {code} lines", file.display()));
            }
        }
        assert!(long.is_empty(), "{}", long.join("\n"));
    }

    /// GitHub's anchor for a heading's text: lower case, every character but
    /// letters, digits, `_`, `-` and spaces dropped, spaces made `-`.
    fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// A Markdown file's heading anchors (a repeated one gets `-1`, `-2`, as
    /// GitHub numbers them) and the destinations of its links and images,
    /// as CommonMark reads them (none from code).
    fn read_markdown(path: &Path) -> (std::collections::HashSet<String>, Vec<String>) {
        use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut anchors = std::collections::HashSet::new();
        let mut seen = std::collections::HashMap::<String, usize>::new();
        let mut links = Vec::new();
        let mut heading: Option<String> = None;
        for event in Parser::new_ext(&text, Options::ENABLE_TABLES) {
            match event {
                Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
                Event::End(TagEnd::Heading(_)) => {
                    let base = anchor(&heading.take().unwrap_or_default());
                    let n = seen.entry(base.clone()).or_insert(0);
                    anchors.insert(match *n {
                        0 => base,
                        n => format!("{base}-{n}"),
                    });
                    *n += 1;
                }
                Event::Text(t) | Event::Code(t) => {
                    if let Some(h) = heading.as_mut() {
                        h.push_str(&t);
                    }
                }
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                    links.push(dest_url.into_string())
                }
                _ => {}
            }
        }
        (anchors, links)
    }

    /// Every relative link and image of the README, `docs/*.md` and
    /// `bench/README.md` names a file that exists, and a `#fragment` into a
    /// Markdown file names one of its headings (web addresses are not
    /// fetched).
    #[test]
    fn every_link_in_the_readme_and_docs_resolves() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut pages = vec![root.join("README.md"), root.join("bench/README.md")];
        for entry in std::fs::read_dir(root.join("docs")).expect("docs/ reads") {
            let path = entry.expect("entry reads").path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
        let mut broken = Vec::new();
        let mut checked = 0;
        // Each linked Markdown file's headings, read once.
        let mut headings = std::collections::HashMap::new();
        for page in &pages {
            let (_, links) = read_markdown(page);
            for link in links {
                if link.contains("://") || link.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
                let target = if path.is_empty() {
                    page.clone()
                } else {
                    page.parent().expect("a page has a folder").join(path)
                };
                let name = page.strip_prefix(root).unwrap_or(page).display();
                if !target.exists() {
                    broken.push(format!("{name}: {link}: no such file"));
                } else if !fragment.is_empty()
                    && target.extension().is_some_and(|e| e == "md")
                    && !headings
                        .entry(target.clone())
                        .or_insert_with(|| read_markdown(&target).0)
                        .contains(fragment)
                {
                    broken.push(format!("{name}: {link}: no such heading"));
                }
            }
        }
        assert!(
            checked > 50,
            "only {checked} links found: is the parser reading them?"
        );
        assert!(broken.is_empty(), "{}", broken.join("\n"));
    }

    /// Issue 51's front door: the README says what seeker is, shows the two
    /// commands and links the manual in `docs/`; it stays short enough to
    /// read in two minutes.
    #[test]
    fn the_readme_stays_a_front_door() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md reads");
        let lines = readme.lines().count();
        assert!(
            lines <= 250,
            "README.md has {lines} lines; move detail to docs/"
        );
        for needed in [
            "scripts/fetch-defaults.sh && cargo run --release -- serve",
            "scripts/test.sh",
            "docs/layout.md",
        ] {
            assert!(readme.contains(needed), "README.md lacks {needed}");
        }
    }
}
