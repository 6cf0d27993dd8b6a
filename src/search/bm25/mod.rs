//! The local BM25 index (tantivy): building it from a JSONL corpus and searching it.
//!
//! Schema: `id` (raw, stored), `title` and `text` (tantivy's `en_stem` analyzer:
//! simple tokenizer, long-token removal, lower-casing, English Porter stemming;
//! term frequencies without positions; stored for display), `url` (stored only).
//! BM25 with tantivy's fixed k1 = 1.2, b = 0.75.
//!
//! Queries are never parsed with tantivy's `QueryParser`: model text full of
//! quotes, colons, dashes and parentheses would make it fail or silently drop
//! words. A query is the analyzer's tokens of the text, each a `TermQuery` on
//! `title` and on `text`, all `Should`: any string gives results or an empty list.
//!
//! Files: this one opens and searches an index; `build.rs` builds one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING,
};
use tantivy::tokenizer::TokenStream;
use tantivy::{DocAddress, Index, IndexReader, ReloadPolicy, TantivyDocument, Term};

use super::{Document, SearchBackend, SearchError};
use crate::pages::{Article, Corpus};

mod build;
pub use build::{build_index, sha256_file};

/// File written next to the index describing what it was built from.
pub const MANIFEST_FILE: &str = "seeker-index.json";
/// Bumped when the schema or analyzer changes, so old indexes are rebuilt.
pub const INDEX_FORMAT: u32 = 1;
/// Distinct query terms used at most; the rest of a very long query is ignored.
pub const MAX_QUERY_TERMS: usize = 256;
const ANALYZER: &str = "en_stem";
/// The name documents from this index carry.
pub const BACKEND_NAME: &str = "tantivy";

/// Errors building or opening an index.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("refusing to replace {0}: it exists and is not a seeker index (no {MANIFEST_FILE}); choose an empty or new directory")]
    NotAnIndex(PathBuf),
    #[error("{path}:{line}: not a corpus record ({message}); expected one JSON object per line with string fields \"id\", \"title\", \"text\" (and optionally \"url\")")]
    BadRecord {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{path}: no index here ({reason}); build one with `seeker index --corpus FILE.jsonl --index {path}`")]
    Missing { path: PathBuf, reason: String },
    #[error("tantivy: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
}

/// What `seeker index` records in [`MANIFEST_FILE`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: u32,
    pub corpus: String,
    /// sha256 of the corpus file, hex: lets scripts tell a stale index.
    pub corpus_sha256: String,
    pub documents: u64,
    pub bytes: u64,
}

/// Totals of an indexing run.
#[derive(Clone, Debug)]
pub struct IndexStats {
    pub documents: u64,
    /// Corpus bytes read.
    pub bytes: u64,
    pub seconds: f64,
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    title: Field,
    text: Field,
    url: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let analyzed = TextOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(ANALYZER)
                .set_index_option(IndexRecordOption::WithFreqs),
        )
        .set_stored();
    let fields = Fields {
        id: b.add_text_field("id", STRING | STORED),
        title: b.add_text_field("title", analyzed.clone()),
        text: b.add_text_field("text", analyzed),
        url: b.add_text_field("url", STORED),
    };
    (b.build(), fields)
}

fn fields_of(schema: &Schema) -> Result<Fields, IndexError> {
    Ok(Fields {
        id: schema.get_field("id")?,
        title: schema.get_field("title")?,
        text: schema.get_field("text")?,
        url: schema.get_field("url")?,
    })
}

/// An open index, shared by all requests (one `IndexReader`).
pub struct Bm25Index {
    index: Index,
    reader: IndexReader,
    fields: Fields,
    manifest: Manifest,
    /// Every live document's address in index order, listed on first use:
    /// row `i` of a dense index is the `i`-th.
    rows: std::sync::OnceLock<Vec<DocAddress>>,
}

impl std::fmt::Debug for Bm25Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bm25Index")
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl Bm25Index {
    /// Opens the index in `dir` (built by [`build_index`]). Where `dir` is
    /// missing because a build was killed while replacing it, the finished
    /// build (else the old index) it left beside `dir` is renamed in first.
    ///
    /// # Errors
    /// [`IndexError::Missing`] when `dir` holds no seeker index (the message says
    /// how to build one); tantivy errors for a damaged index.
    pub fn open(dir: &Path) -> Result<Self, IndexError> {
        if !dir.exists() {
            // A `seeker index` killed mid-replacement: serve what it left.
            if let Some(replacement) = build::replacement(dir) {
                if let Err(e) = replacement.recover(&build::is_index) {
                    tracing::warn!(index = %dir.display(), error = %e, "could not adopt an interrupted build");
                }
            }
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest: Manifest = match std::fs::read(&manifest_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| IndexError::Missing {
                path: dir.to_path_buf(),
                reason: format!("unreadable {MANIFEST_FILE}: {e}"),
            })?,
            Err(e) => {
                return Err(IndexError::Missing {
                    path: dir.to_path_buf(),
                    reason: format!("{MANIFEST_FILE}: {e}"),
                })
            }
        };
        if manifest.format != INDEX_FORMAT {
            return Err(IndexError::Missing {
                path: dir.to_path_buf(),
                reason: format!(
                    "index format {} but this seeker reads format {INDEX_FORMAT}",
                    manifest.format
                ),
            });
        }
        let index = Index::open_in_dir(dir)?;
        let fields = fields_of(&index.schema())?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(Self {
            index,
            reader,
            fields,
            manifest,
            rows: std::sync::OnceLock::new(),
        })
    }

    /// What the index was built from.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Number of documents in the index.
    pub fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// The analyzer's terms for `query` on `title` and `text`, deduplicated,
    /// at most [`MAX_QUERY_TERMS`].
    fn terms(&self, query: &str) -> Result<Vec<Term>, IndexError> {
        let mut seen = HashSet::new();
        let mut terms = Vec::new();
        for field in [self.fields.title, self.fields.text] {
            let mut analyzer = self.index.tokenizer_for_field(field)?;
            let mut stream = analyzer.token_stream(query);
            while let Some(token) = stream.next() {
                if seen.len() >= 2 * MAX_QUERY_TERMS {
                    break;
                }
                let term = Term::from_field_text(field, &token.text);
                if seen.insert(term.clone()) {
                    terms.push(term);
                }
            }
        }
        Ok(terms)
    }

    /// The top `k` documents for any text, best first; an empty list when the
    /// text has no indexable word or `k` is 0. Synchronous CPU work: call it
    /// off the async runtime.
    ///
    /// # Errors
    /// Only tantivy I/O errors on a damaged index.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, IndexError> {
        let terms = self.terms(query)?;
        // More than the index holds is all of it (and never a giant allocation).
        let k = k.min(self.num_docs() as usize);
        if k == 0 || terms.is_empty() {
            return Ok(Vec::new());
        }
        let clauses: Vec<(Occur, Box<dyn Query>)> = terms
            .into_iter()
            .map(|t| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(t, IndexRecordOption::WithFreqs));
                (Occur::Should, q)
            })
            .collect();
        let query = BooleanQuery::new(clauses);
        let searcher = self.reader.searcher();
        let top = searcher.search(&query, &TopDocs::with_limit(k).order_by_score())?;
        top.into_iter()
            .map(|(score, address)| self.document(&searcher, address, score))
            .collect()
    }

    /// The stored document at `address` as a search result scored `score`.
    ///
    /// # Errors
    /// Only tantivy I/O errors on a damaged index.
    fn document(
        &self,
        searcher: &tantivy::Searcher,
        address: DocAddress,
        score: f32,
    ) -> Result<Document, IndexError> {
        let doc: TantivyDocument = searcher.doc(address)?;
        let url = text_of(&doc, self.fields.url);
        Ok(Document {
            id: text_of(&doc, self.fields.id),
            title: text_of(&doc, self.fields.title),
            text: text_of(&doc, self.fields.text),
            url: (!url.is_empty()).then_some(url),
            score,
            backend: BACKEND_NAME.to_string(),
        })
    }
}

/// Rows: the index's documents by position, what a dense index
/// ([`super::dense`]) stores one vector per. The index is never modified after
/// [`build_index`], so the order is fixed for its lifetime.
impl Bm25Index {
    fn rows(&self) -> &[DocAddress] {
        self.rows.get_or_init(|| {
            let searcher = self.reader.searcher();
            let mut rows = Vec::with_capacity(searcher.num_docs() as usize);
            for (ord, segment) in searcher.segment_readers().iter().enumerate() {
                let alive = segment.alive_bitset();
                for doc in 0..segment.max_doc() {
                    if alive.is_none_or(|a| a.is_alive(doc)) {
                        rows.push(DocAddress::new(ord as u32, doc));
                    }
                }
            }
            rows
        })
    }

    /// Number of rows (the live documents).
    pub fn row_count(&self) -> usize {
        self.rows().len()
    }

    /// The documents at `rows` (each with the score given beside it), in that
    /// order, as [`Self::search`] returns them; a row past the end is skipped.
    ///
    /// # Errors
    /// Only tantivy I/O errors on a damaged index.
    pub fn documents_at(&self, rows: &[(usize, f32)]) -> Result<Vec<Document>, IndexError> {
        let all = self.rows();
        let searcher = self.reader.searcher();
        let mut out = Vec::with_capacity(rows.len());
        for &(row, score) in rows {
            let Some(address) = all.get(row) else {
                continue;
            };
            out.push(self.document(&searcher, *address, score)?);
        }
        Ok(out)
    }
}

/// A stored field's text (empty when the document has none).
fn text_of(doc: &TantivyDocument, field: Field) -> String {
    doc.get_first(field)
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string()
}

/// The page reader opens corpus documents through the index.
impl Corpus for Bm25Index {
    fn article(&self, locator: &str) -> Result<Option<Article>, String> {
        Bm25Index::article(self, locator).map_err(|e| e.to_string())
    }
}

/// Passages of one title joined into an article, at most.
const MAX_ARTICLE_PASSAGES: usize = 200;

impl Bm25Index {
    /// Opens a document by its `id`, or else by its title (exact, ignoring
    /// case): the article is every passage sharing that title (corpora split
    /// Wikipedia articles into passages), in corpus order, at most 200.
    /// Synchronous: call it off the async runtime.
    ///
    /// # Errors
    /// Only tantivy I/O errors on a damaged index.
    pub fn article(&self, locator: &str) -> Result<Option<Article>, IndexError> {
        let locator = locator.trim();
        if locator.is_empty() {
            return Ok(None);
        }
        let searcher = self.reader.searcher();
        let by_id = TermQuery::new(
            Term::from_field_text(self.fields.id, locator),
            IndexRecordOption::Basic,
        );
        let title = match searcher
            .search(&by_id, &TopDocs::with_limit(1).order_by_score())?
            .first()
        {
            Some((_, address)) => text_of(&searcher.doc(*address)?, self.fields.title),
            None => locator.to_string(),
        };
        // Every title term must match; exact equality is checked after.
        let mut analyzer = self.index.tokenizer_for_field(self.fields.title)?;
        let mut stream = analyzer.token_stream(&title);
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        while let Some(token) = stream.next() {
            let term = Term::from_field_text(self.fields.title, &token.text);
            clauses.push((
                Occur::Must,
                Box::new(TermQuery::new(term, IndexRecordOption::Basic)),
            ));
        }
        let mut passages = Vec::new();
        if clauses.is_empty() {
            // A title without indexable words ("0" is one): the id match only.
            if let Some((_, address)) = searcher
                .search(&by_id, &TopDocs::with_limit(1).order_by_score())?
                .first()
            {
                passages.push((*address, searcher.doc::<TantivyDocument>(*address)?));
            }
        } else {
            let query = BooleanQuery::new(clauses);
            for (_, address) in searcher.search(
                &query,
                &TopDocs::with_limit(MAX_ARTICLE_PASSAGES).order_by_score(),
            )? {
                let doc: TantivyDocument = searcher.doc(address)?;
                if text_of(&doc, self.fields.title).to_lowercase() == title.to_lowercase() {
                    passages.push((address, doc));
                }
            }
        }
        passages.sort_by_key(|(address, _)| (address.segment_ord, address.doc_id));
        let Some((_, first)) = passages.first() else {
            return Ok(None);
        };
        Ok(Some(Article {
            id: text_of(first, self.fields.id),
            title: text_of(first, self.fields.title),
            text: passages
                .iter()
                .map(|(_, d)| text_of(d, self.fields.text))
                .collect::<Vec<_>>()
                .join("\n\n"),
        }))
    }
}

/// [`SearchBackend`] over a shared [`Bm25Index`]: each query runs on tokio's
/// blocking pool, so a slow query never stalls the async runtime; the
/// dispatcher runs a round's queries concurrently.
#[derive(Clone, Debug)]
pub struct Bm25Backend {
    index: Arc<Bm25Index>,
}

impl Bm25Backend {
    pub fn new(index: Arc<Bm25Index>) -> Self {
        Self { index }
    }
}

#[async_trait]
impl SearchBackend for Bm25Backend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let index = Arc::clone(&self.index);
        let q = query.to_string();
        match tokio::task::spawn_blocking(move || index.search(&q, k)).await {
            Ok(Ok(docs)) => Ok(docs),
            Ok(Err(e)) => Err(SearchError::Backend(e.to_string())),
            Err(e) => Err(SearchError::Backend(format!("search worker failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_index() -> (tempfile::TempDir, Bm25Index) {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        std::fs::write(
            &corpus,
            concat!(
                r#"{"id": "0", "title": "Mona Lisa", "text": "The Mona Lisa is a portrait painting by Leonardo da Vinci."}"#,
                "\n",
                r#"{"id": "1", "title": "Paris", "text": "Paris is the capital of France."}"#,
                "\n\n",
                r#"{"id": "2", "title": "Painting", "text": "Painting is the practice of applying paint.", "url": "https://en.wikipedia.org/wiki/Painting"}"#,
                "\n"
            ),
        )
        .unwrap();
        let index_dir = dir.path().join("index");
        let stats = build_index(&corpus, &index_dir, |_| {}).unwrap();
        assert_eq!(stats.documents, 3);
        let index = Bm25Index::open(&index_dir).unwrap();
        assert_eq!(
            index.manifest().corpus_sha256,
            sha256_file(&corpus).unwrap()
        );
        (dir, index)
    }

    #[test]
    fn a_document_opens_by_id_or_exact_title() {
        let (_dir, index) = small_index();
        let paris = index.article("1").unwrap().unwrap();
        assert_eq!((paris.id.as_str(), paris.title.as_str()), ("1", "Paris"));
        assert_eq!(paris.text, "Paris is the capital of France.");
        let mona = index.article(" mona lisa ").unwrap().unwrap();
        assert_eq!(mona.id, "0");
        assert!(mona.text.starts_with("The Mona Lisa"));
        assert_eq!(index.article("Mona").unwrap(), None);
        assert_eq!(index.article("").unwrap(), None);
    }

    #[test]
    fn stemmed_bm25_ranks_the_matching_document_first() {
        let (_dir, index) = small_index();
        let hits = index.search("Who painted the Mona Lisa?", 3).unwrap();
        assert_eq!(hits[0].title, "Mona Lisa");
        assert!(hits[0].text.contains("Leonardo da Vinci"));
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        let hits = index.search("paintings", 1).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(
            hits[0].url.as_deref(),
            Some("https://en.wikipedia.org/wiki/Painting")
        );
    }

    #[test]
    fn any_string_is_a_valid_query() {
        let (_dir, index) = small_index();
        for q in [
            "",
            "   ",
            "\"unbalanced quote",
            "title:Paris AND -France (OR)",
            "https://example.com/a?b=c&d=e",
            "東京 タワー",
            "🦀🦀",
            "NOT",
            "*?~^:",
            &"paris ".repeat(10_000),
        ] {
            let hits = index.search(q, 3);
            assert!(hits.is_ok(), "{q:?}: {hits:?}");
        }
        assert!(index.search("", 3).unwrap().is_empty());
        assert!(index.search("paris", 0).unwrap().is_empty());
        assert_eq!(
            index.search("title:Paris AND -France", 1).unwrap()[0].title,
            "Paris"
        );
    }

    #[test]
    fn malformed_corpus_line_is_reported_with_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("bad.jsonl");
        std::fs::write(
            &corpus,
            "{\"id\":\"0\",\"title\":\"a\",\"text\":\"b\"}\n{\"id\": 1}\n",
        )
        .unwrap();
        let err = build_index(&corpus, &dir.path().join("index"), |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.jsonl:2"), "{err}");
        let err = Bm25Index::open(&dir.path().join("nothing"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("seeker index"), "{err}");
    }

    #[test]
    fn never_replaces_a_directory_that_is_not_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        std::fs::write(&corpus, "{\"id\":\"0\",\"title\":\"a\",\"text\":\"b\"}\n").unwrap();
        let precious = dir.path().join("precious");
        std::fs::create_dir(&precious).unwrap();
        std::fs::write(precious.join("thesis.txt"), "years of work").unwrap();
        let err = build_index(&corpus, &precious, |_| {}).unwrap_err();
        assert!(matches!(err, IndexError::NotAnIndex(_)), "{err}");
        assert!(precious.join("thesis.txt").is_file());
        // A path ending in "." (the working directory, say) is refused the same way.
        let err = build_index(&corpus, &precious.join("."), |_| {}).unwrap_err();
        assert!(matches!(err, IndexError::NotAnIndex(_)), "{err}");
        assert!(precious.join("thesis.txt").is_file());

        // An empty directory, and an existing index, are fine to (re)build into.
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        build_index(&corpus, &empty, |_| {}).unwrap();
        build_index(&corpus, &empty, |_| {}).unwrap();
        assert_eq!(Bm25Index::open(&empty).unwrap().num_docs(), 1);
        assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")));
    }

    #[test]
    fn a_huge_k_returns_at_most_the_whole_index() {
        let (_dir, index) = small_index();
        assert_eq!(
            index
                .search("paris painting lisa", usize::MAX)
                .unwrap()
                .len(),
            3
        );
    }

    #[tokio::test]
    async fn a_round_through_the_dispatcher_answers_each_query_in_order() {
        let (_dir, index) = small_index();
        let dispatcher = crate::search::dispatch::Dispatcher::single(
            "tantivy",
            Arc::new(Bm25Backend::new(Arc::new(index))),
        );
        let results = dispatcher
            .search_round(
                None,
                &["capital of France".into(), "".into(), "Mona Lisa".into()],
                1,
            )
            .await;
        assert_eq!(results.len(), 3);
        let docs = |i: usize| results[i].result.as_ref().unwrap();
        assert_eq!(docs(0)[0].title, "Paris");
        assert_eq!(docs(0)[0].backend, "tantivy");
        assert!(docs(1).is_empty());
        assert_eq!(docs(2)[0].title, "Mona Lisa");
    }
}
