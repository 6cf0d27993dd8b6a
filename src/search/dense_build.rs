//! Building the dense index ([`super::dense`]): every document of a BM25
//! index embedded, written beside it and moved into place with renames a kill
//! cannot interrupt harmfully ([`crate::tempfiles::Replacement`]), the
//! manifest written last.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use super::bm25::Bm25Index;
use super::dense::{
    io, DenseError, DenseManifest, DenseStats, DENSE_DIR, DENSE_FORMAT, DENSE_MANIFEST,
    VECTORS_FILE,
};
use super::embed::{EmbedError, Embedder};

/// How `<index_dir>/dense` is replaced: built in `.dense.tmp-{pid}`, the old
/// one moved aside to `.dense.old-{pid}` while the new one is renamed in.
///
/// # Errors
/// When `index_dir` cannot be made absolute.
pub(super) fn dense_replacement(
    index_dir: &Path,
) -> std::io::Result<crate::tempfiles::Replacement> {
    Ok(crate::tempfiles::Replacement {
        target: std::path::absolute(index_dir)?.join(DENSE_DIR),
        tmp: ".dense.tmp-".into(),
        aside: ".dense.old-".into(),
    })
}

/// Whether `dir` holds a finished dense index (its manifest is written last).
pub(super) fn is_dense_index(dir: &Path) -> bool {
    dir.join(DENSE_MANIFEST).is_file()
}

/// Embeds every document of the BM25 index in `index_dir` with `embedder`,
/// `batch` passages per forward pass (shortest first, so padding stays
/// small), and writes `<index_dir>/dense`. Written to a temporary directory
/// and moved into place at the end: an interrupted build leaves the old
/// dense index (or none) intact. `on_progress(done, total)` follows each
/// batch; batches run one per core.
///
/// # Errors
/// An index that does not open, encoder failures, I/O.
pub fn build_dense(
    index_dir: &Path,
    embedder: &Embedder,
    batch: usize,
    on_progress: impl Fn(usize, usize) + Sync,
) -> Result<DenseStats, DenseError> {
    let started = Instant::now();
    let index = Bm25Index::open(index_dir)?;
    let rows = index.row_count();
    let all: Vec<(usize, f32)> = (0..rows).map(|r| (r, 0.0)).collect();
    let docs = index.documents_at(&all)?;
    let texts: Vec<String> = docs
        .iter()
        .map(|d| format!("\"{}\"\n{}", d.title, d.text))
        .collect();
    drop(docs);
    let dim = embedder.spec().dim;
    let vectors = embed_all(&texts, embedder, batch, &on_progress)?;

    let replacement = dense_replacement(index_dir).map_err(io(index_dir))?;
    replacement.clean(&is_dense_index).map_err(io(index_dir))?;
    let tmp = replacement.tmp_path();
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    write_vectors(&tmp.join(VECTORS_FILE), &vectors)?;
    let seconds = started.elapsed().as_secs_f64();
    let manifest = DenseManifest {
        format: DENSE_FORMAT,
        corpus_sha256: index.manifest().corpus_sha256.clone(),
        rows,
        encoder: embedder.spec().clone(),
        model: embedder.dir().display().to_string(),
        seconds,
    };
    let manifest_path = tmp.join(DENSE_MANIFEST);
    let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    std::fs::write(&manifest_path, json + "\n").map_err(io(&manifest_path))?;
    // Killed at any point, the old or the new dense index is served.
    replacement.replace().map_err(io(&replacement.target))?;
    Ok(DenseStats { rows, dim, seconds })
}

/// The embeddings of `texts` (`rows × dim`, row `i` of text `i`), `batch`
/// passages per forward pass, shortest first (so padding stays small), one
/// batch per core; `on_progress(done, rows)` after each batch.
///
/// # Errors
/// The first encoder failure (the other workers stop at their next batch).
fn embed_all(
    texts: &[String],
    embedder: &Embedder,
    batch: usize,
    on_progress: &(impl Fn(usize, usize) + Sync),
) -> Result<Vec<f32>, EmbedError> {
    let rows = texts.len();
    let dim = embedder.spec().dim;
    let mut order: Vec<usize> = (0..rows).collect();
    order.sort_by_key(|&i| texts[i].len());
    let batch = batch.max(1);
    let batches: Vec<&[usize]> = order.chunks(batch).collect();
    // One worker per core, each a batch at a time: candle's own threading
    // (gemm's) gains little on BERT-sized matrices (measured: 2 threads 1.19x
    // one on 2 cores), a batch per core gains more.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(batches.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new((vec![0f32; rows * dim], 0usize));
    let failed: std::sync::Mutex<Option<EmbedError>> = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(chunk) = batches.get(i) else { break };
                if failed
                    .lock()
                    .expect("no worker panics holding it")
                    .is_some()
                {
                    break;
                }
                let refs: Vec<&str> = chunk.iter().map(|&r| texts[r].as_str()).collect();
                match embedder.embed_passages(&refs) {
                    Ok(out) => {
                        let mut guard = done.lock().expect("no worker panics holding it");
                        let (vectors, count) = &mut *guard;
                        for (&row, v) in chunk.iter().zip(out) {
                            vectors[row * dim..(row + 1) * dim].copy_from_slice(&v);
                        }
                        *count += chunk.len();
                        on_progress(*count, rows);
                    }
                    Err(e) => {
                        *failed.lock().expect("no worker panics holding it") = Some(e);
                        break;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("workers joined") {
        return Err(e);
    }
    Ok(done.into_inner().expect("workers joined").0)
}

/// Writes `vectors` to `path` as little-endian `f32`s.
///
/// # Errors
/// [`DenseError::Io`] naming `path`.
fn write_vectors(path: &Path, vectors: &[f32]) -> Result<(), DenseError> {
    let file = std::fs::File::create(path).map_err(io(path))?;
    let mut w = BufWriter::new(file);
    for x in vectors {
        w.write_all(&x.to_le_bytes()).map_err(io(path))?;
    }
    w.flush().map_err(io(path))
}
