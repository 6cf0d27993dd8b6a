//! The dense index: one embedding per document of a BM25 index, stored beside
//! it, searched by inner product; and the `dense` and `hybrid` backends.
//!
//! Layout: `<index>/dense/seeker-dense.json` (the [`DenseManifest`]) and
//! `<index>/dense/vectors.f32` (`rows × dim` little-endian `f32`, row `i` the
//! `i`-th document of the BM25 index, see [`Bm25Index::documents_at`]). A
//! document is embedded as Search-R1's and FlashRAG's corpora give it to
//! their encoders: `"{title}"\n{text}`, after the encoder's passage prefix.
//! Rebuilding the BM25 index removes the dense index with it (it lives inside);
//! one built from another corpus or another encoder is refused at open.
//!
//! Search is exact (every row's inner product with the query: one
//! matrix-vector product, top-k kept in a heap) up to
//! `search.dense.approximate_above` rows; a larger corpus is searched by its
//! sign-bit codes, with the best `search.dense.rescore` candidates scored
//! exactly ([`super::signbits`]), made from the same vectors when the index
//! opens. `bench/README.md` has the figures. The `hybrid` backend, which fuses
//! this one with BM25, is [`super::hybrid`].

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::bm25::{Bm25Index, IndexError};
pub use super::dense_build::build_dense;
use super::dense_build::{dense_replacement, is_dense_index};
use super::embed::{top_k, EmbedError, Embedder, EncoderSpec};
use super::signbits::SignCodes;
use super::{Document, SearchBackend, SearchError};

/// Directory of the dense index inside a BM25 index directory.
pub const DENSE_DIR: &str = "dense";
/// The dense index's manifest file.
pub const DENSE_MANIFEST: &str = "seeker-dense.json";
pub(super) const VECTORS_FILE: &str = "vectors.f32";
/// Bumped when the file layout or the passage text changes.
pub const DENSE_FORMAT: u32 = 1;

/// Errors building or opening a dense index.
#[derive(Debug, thiserror::Error)]
pub enum DenseError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error("dense index: {0}")]
    Tensor(#[from] candle_core::Error),
    /// No dense index, or one that does not belong to this BM25 index or
    /// encoder; the message says how to build the right one.
    #[error("{path}: {reason}; build it with `seeker index --dense {model} --index {index}`")]
    Unusable {
        path: PathBuf,
        index: PathBuf,
        /// The encoder's directory, as the rebuild command needs it.
        model: PathBuf,
        reason: String,
    },
}

/// What a dense index was built from and with.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct DenseManifest {
    pub format: u32,
    /// The BM25 index's corpus hash ([`super::bm25::Manifest::corpus_sha256`]).
    pub corpus_sha256: String,
    pub rows: usize,
    pub encoder: EncoderSpec,
    /// The model directory it was built with (informational).
    pub model: String,
    /// Seconds the build took.
    pub seconds: f64,
}

/// How an open index searches (`[search.dense]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseSearch {
    /// Indexes with more rows than this are searched by their sign-bit codes
    /// ([`super::signbits`]); up to it, exactly.
    pub approximate_above: usize,
    /// Candidates the codes keep for exact scoring (at least top-k).
    pub rescore: usize,
}

/// A built index: figures for the command line.
#[derive(Clone, Debug)]
pub struct DenseStats {
    pub rows: usize,
    pub dim: usize,
    pub seconds: f64,
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DenseError + '_ {
    move |error| DenseError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// An open dense index, held in memory (`rows × dim × 4` bytes).
pub struct DenseIndex {
    search: Search,
    dim: usize,
    manifest: DenseManifest,
}

/// How a [`DenseIndex`] finds its top k.
enum Search {
    /// One `(rows, dim)` matrix: a query's scores are one matrix-vector
    /// product (candle's gemm, SIMD and threaded).
    Exact(candle_core::Tensor),
    /// The vectors (row-major) and their sign-bit codes, `rescore`
    /// candidates scored exactly.
    Binary {
        vectors: Vec<f32>,
        codes: SignCodes,
        rescore: usize,
    },
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseIndex")
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl DenseIndex {
    /// Opens `<index_dir>/dense` for the BM25 index `bm25` (opened from the
    /// same directory) and the encoder `spec`, searched as `search` says: an
    /// index of more than `search.approximate_above` rows gets its sign-bit
    /// codes made (about a second per million 384-d rows). `model_dir`, the
    /// encoder's directory, only goes into the rebuild command an error names.
    ///
    /// # Errors
    /// [`DenseError::Unusable`] when there is no dense index, or it was built
    /// from another corpus, for another number of documents, or with another
    /// encoder, or its vectors hold a NaN or an infinity; I/O errors.
    pub fn open(
        index_dir: &Path,
        bm25: &Bm25Index,
        spec: &EncoderSpec,
        model_dir: &Path,
        search: DenseSearch,
    ) -> Result<Self, DenseError> {
        let dir = index_dir.join(DENSE_DIR);
        if !dir.exists() {
            // A dense build killed mid-replacement: serve what it left.
            if let Ok(replacement) = dense_replacement(index_dir) {
                if let Err(e) = replacement.recover(&is_dense_index) {
                    tracing::warn!(index = %dir.display(), error = %e, "could not adopt an interrupted dense build");
                }
            }
        }
        let unusable = |reason: String| DenseError::Unusable {
            path: dir.clone(),
            index: index_dir.to_path_buf(),
            model: model_dir.to_path_buf(),
            reason,
        };
        let manifest_path = dir.join(DENSE_MANIFEST);
        let manifest: DenseManifest = match std::fs::read(&manifest_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| unusable(format!("unreadable {DENSE_MANIFEST}: {e}")))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(unusable("no dense index here".into()))
            }
            Err(e) => return Err(io(&manifest_path)(e)),
        };
        if manifest.format != DENSE_FORMAT {
            return Err(unusable(format!(
                "dense format {} but this seeker reads format {DENSE_FORMAT}",
                manifest.format
            )));
        }
        if manifest.corpus_sha256 != bm25.manifest().corpus_sha256 {
            return Err(unusable(
                "built from another corpus than the BM25 index".into(),
            ));
        }
        if manifest.rows != bm25.row_count() {
            return Err(unusable(format!(
                "{} rows but the BM25 index holds {} documents",
                manifest.rows,
                bm25.row_count()
            )));
        }
        if manifest.encoder != *spec {
            return Err(unusable(format!(
                "built with another encoder or other encoder settings ({} from {}); \
                 rebuild it, or set [search.dense] to match",
                short(&manifest.encoder.fingerprint),
                manifest.model
            )));
        }
        let path = dir.join(VECTORS_FILE);
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(io(&path))?;
        let dim = spec.dim;
        if bytes.len() != manifest.rows * dim * 4 {
            return Err(unusable(format!(
                "{VECTORS_FILE} holds {} bytes, expected {} rows × {dim} × 4",
                bytes.len(),
                manifest.rows
            )));
        }
        let vectors: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        drop(bytes);
        if let Some(at) = vectors.iter().position(|x| !x.is_finite()) {
            return Err(unusable(format!(
                "{VECTORS_FILE} row {} holds a value that is not a finite number",
                at / dim.max(1)
            )));
        }
        // Graph files an earlier seeker built beside the vectors (it searched
        // large indexes with an HNSW graph): nothing reads them now.
        let stale: Vec<String> = ["hnsw.hnsw.graph", "hnsw.hnsw.data"]
            .iter()
            .filter(|name| dir.join(name).is_file())
            .map(|name| dir.join(name).display().to_string())
            .collect();
        if !stale.is_empty() {
            tracing::warn!(
                files = %stale.join(", "),
                "an HNSW graph from an earlier seeker is unused (large indexes are searched \
                 by sign-bit codes now); delete the files to free the disk"
            );
        }
        if manifest.rows > search.approximate_above {
            let codes = SignCodes::new(&vectors, dim);
            return Ok(Self {
                search: Search::Binary {
                    vectors,
                    codes,
                    rescore: search.rescore,
                },
                dim,
                manifest,
            });
        }
        Ok(Self::from_vectors(vectors, dim, manifest)?)
    }

    /// Whether queries go to the sign-bit codes (else exact search).
    pub fn is_approximate(&self) -> bool {
        matches!(self.search, Search::Binary { .. })
    }

    /// What it was built from.
    pub fn manifest(&self) -> &DenseManifest {
        &self.manifest
    }

    /// An index over `vectors` (`rows × encoder.dim` floats, row-major) that
    /// no file backs: for benchmarks and tests.
    ///
    /// # Errors
    /// candle failures.
    pub fn in_memory(vectors: Vec<f32>, encoder: EncoderSpec) -> Result<Self, candle_core::Error> {
        let dim = encoder.dim;
        let manifest = DenseManifest {
            format: DENSE_FORMAT,
            corpus_sha256: String::new(),
            rows: vectors.len() / dim.max(1),
            encoder,
            model: String::new(),
            seconds: 0.0,
        };
        Self::from_vectors(vectors, dim, manifest)
    }

    fn from_vectors(
        vectors: Vec<f32>,
        dim: usize,
        manifest: DenseManifest,
    ) -> Result<Self, candle_core::Error> {
        let rows = vectors.len() / dim.max(1);
        let matrix =
            candle_core::Tensor::from_vec(vectors, (rows, dim), &candle_core::Device::Cpu)?;
        Ok(Self {
            search: Search::Exact(matrix),
            dim,
            manifest,
        })
    }

    /// The `k` rows with the highest inner product with `query` (a vector of
    /// the index's dimension), best first, with their scores; none for a
    /// query of another length.
    ///
    /// # Errors
    /// candle failures (none expected for a well-formed index).
    pub fn search(&self, query: &[f32], k: usize) -> Result<Vec<(usize, f32)>, candle_core::Error> {
        if k == 0 || query.len() != self.dim || self.manifest.rows == 0 {
            return Ok(Vec::new());
        }
        let matrix = match &self.search {
            Search::Exact(matrix) => matrix,
            Search::Binary {
                vectors,
                codes,
                rescore,
            } => return Ok(codes.search(vectors, query, k, *rescore)),
        };
        let q = candle_core::Tensor::from_slice(query, (self.dim, 1), &candle_core::Device::Cpu)?;
        let scores = matrix.matmul(&q)?.squeeze(1)?.to_vec1::<f32>()?;
        Ok(top_k(scores.into_iter().enumerate(), k))
    }
}

fn short(fingerprint: &str) -> String {
    format!("encoder {}", &fingerprint[..fingerprint.len().min(12)])
}

/// Reply to one query of a [`QueryEncoder`].
type EncodedQuery = tokio::sync::oneshot::Sender<Result<Vec<f32>, String>>;

/// Embeds queries on one worker thread, in batches: the queries that arrive
/// while a batch is encoded form the next one (up to `max_batch`), so
/// concurrent searches share a forward pass (16 queries of MiniLM: ~100 ms
/// in one batch, ~260 ms one by one on 2 cores; `bench/README.md`) and a
/// lone query waits for nothing.
struct QueryEncoder {
    jobs: std::sync::mpsc::Sender<(String, EncodedQuery)>,
}

impl QueryEncoder {
    fn start(embedder: Arc<Embedder>, max_batch: usize) -> Self {
        let (jobs, queue) = std::sync::mpsc::channel::<(String, EncodedQuery)>();
        let max_batch = max_batch.max(1);
        std::thread::Builder::new()
            .name("seeker-embed".into())
            .spawn(move || {
                // Ends when the backend (the only sender) is dropped.
                while let Ok(first) = queue.recv() {
                    let mut batch = vec![first];
                    while batch.len() < max_batch {
                        match queue.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    let texts: Vec<&str> = batch.iter().map(|(q, _)| q.as_str()).collect();
                    match embedder.embed_queries(&texts) {
                        Ok(vectors) => {
                            for ((_, reply), v) in batch.into_iter().zip(vectors) {
                                let _ = reply.send(Ok(v));
                            }
                        }
                        Err(e) => {
                            for (_, reply) in batch {
                                let _ = reply.send(Err(e.to_string()));
                            }
                        }
                    }
                }
            })
            .expect("spawning the query encoder thread");
        Self { jobs }
    }

    async fn embed(&self, query: String) -> Result<Vec<f32>, SearchError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let stopped = || SearchError::Backend("the query encoder stopped".into());
        self.jobs.send((query, reply)).map_err(|_| stopped())?;
        answer
            .await
            .map_err(|_| stopped())?
            .map_err(SearchError::Backend)
    }
}

/// The `dense` backend: the query embedded (batched with concurrent ones,
/// [`QueryEncoder`]), the dense index searched and the documents read from
/// the BM25 index on the blocking pool. Scores are cosine similarities.
pub struct DenseBackend {
    bm25: Arc<Bm25Index>,
    dense: Arc<DenseIndex>,
    encoder: QueryEncoder,
}

impl DenseBackend {
    /// `max_batch`: queries embedded in one forward pass at most
    /// (`search.dense.batch_size`).
    pub fn new(
        bm25: Arc<Bm25Index>,
        dense: Arc<DenseIndex>,
        embedder: Arc<Embedder>,
        max_batch: usize,
    ) -> Self {
        Self {
            bm25,
            dense,
            encoder: QueryEncoder::start(embedder, max_batch),
        }
    }
}

#[async_trait]
impl SearchBackend for DenseBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        if query.trim().is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        let v = self.encoder.embed(query.to_string()).await?;
        let (bm25, dense) = (Arc::clone(&self.bm25), Arc::clone(&self.dense));
        let work = move || -> Result<Vec<Document>, SearchError> {
            let hits = dense
                .search(&v, k)
                .map_err(|e| SearchError::Backend(format!("dense search: {e}")))?;
            bm25.documents_at(&hits)
                .map_err(|e| SearchError::Backend(e.to_string()))
        };
        match tokio::task::spawn_blocking(work).await {
            Ok(r) => r,
            Err(e) => Err(SearchError::Backend(format!("search worker failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_search_returns_the_best_rows_in_order() {
        let index = DenseIndex::from_vectors(
            vec![1.0, 0.0, 0.0, 1.0, 0.6, 0.8, -1.0, 0.0],
            2,
            DenseManifest {
                format: DENSE_FORMAT,
                corpus_sha256: String::new(),
                rows: 4,
                encoder: EncoderSpec {
                    fingerprint: String::new(),
                    dim: 2,
                    pooling: super::super::embed::Pooling::Mean,
                    query_prefix: String::new(),
                    passage_prefix: String::new(),
                    max_length: 8,
                },
                model: String::new(),
                seconds: 0.0,
            },
        )
        .unwrap();
        let hits = index.search(&[0.8, 0.6], 3).unwrap();
        let rows: Vec<usize> = hits.iter().map(|h| h.0).collect();
        assert_eq!(rows, [2, 0, 1]);
        assert!((hits[0].1 - 0.96).abs() < 1e-6);
        assert!(
            index.search(&[1.0], 3).unwrap().is_empty(),
            "a wrong-sized query finds nothing"
        );
        assert_eq!(index.search(&[1.0, 0.0], 10).unwrap().len(), 4);
    }
}
