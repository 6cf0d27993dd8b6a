//! Building the BM25 index from a JSONL corpus (`{"id", "title", "text",
//! "url"?}` per line), atomically: written beside the target and moved into
//! place with renames a kill cannot interrupt harmfully
//! ([`crate::tempfiles::Replacement`]), with a manifest of what it was built
//! from, written last.
//!
//! Seam: `seeker index` and the tests call [`build_index`]; the schema and
//! manifest are the parent module's ([`super::Bm25Index`] opens the result).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tantivy::{Index, TantivyDocument};

use crate::tempfiles::Replacement;

use super::{schema, IndexError, IndexStats, Manifest, INDEX_FORMAT, MANIFEST_FILE};

#[derive(Deserialize)]
struct CorpusRecord {
    id: String,
    title: String,
    text: String,
    #[serde(default)]
    url: Option<String>,
}

/// Where [`build_index`] writes: how the target is replaced, and the fresh
/// temporary directory beside it.
struct Target {
    replacement: Replacement,
    tmp: PathBuf,
}

/// How `index_dir` is replaced: builds in `.{name}.tmp-{pid}` beside it, the
/// old index moved aside to `.{name}.old-{pid}` while the new one is renamed
/// in. `None` for a path without a final component.
pub(crate) fn replacement(index_dir: &Path) -> Option<Replacement> {
    let absolute = std::path::absolute(index_dir).ok()?;
    let name = absolute.file_name()?.to_string_lossy().into_owned();
    Some(Replacement {
        target: absolute,
        tmp: format!(".{name}.tmp-"),
        aside: format!(".{name}.old-"),
    })
}

/// Whether `dir` holds a finished BM25 index (its manifest is written last).
pub(crate) fn is_index(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// Adopts what an interrupted replacement of `index_dir` left (a finished
/// build, else the old index moved aside), removes what else stopped builds
/// left beside it, checks `index_dir` (missing, empty, or a seeker index)
/// and creates the temporary directory the build writes (same file system,
/// so the final renames are atomic).
///
/// # Errors
/// [`IndexError::NotAnIndex`] for a directory with other files in it; I/O.
fn build_target(index_dir: &Path) -> Result<Target, IndexError> {
    let replacement =
        replacement(index_dir).ok_or_else(|| IndexError::NotAnIndex(index_dir.to_path_buf()))?;
    replacement.clean(&is_index).map_err(io(index_dir))?;
    match std::fs::read_dir(index_dir) {
        Ok(mut entries) => {
            if !is_index(index_dir) && entries.next().is_some() {
                return Err(IndexError::NotAnIndex(index_dir.to_path_buf()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) if index_dir.exists() => return Err(io(index_dir)(e)),
        Err(_) => {}
    }
    let tmp = replacement.tmp_path();
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    Ok(Target { replacement, tmp })
}

/// Builds a BM25 index of the JSONL `corpus` into `index_dir`, merged into one
/// segment. The index is built in a sibling temporary directory and moved into
/// place at the end, replacing an index already there; an interrupted run
/// leaves the old index intact. A directory that exists, is not empty and holds
/// no seeker index is never touched.
///
/// `on_progress(bytes_read)` is called every few hundred documents.
///
/// # Errors
/// I/O errors, a malformed corpus line (with its line number), tantivy errors.
pub fn build_index(
    corpus: &Path,
    index_dir: &Path,
    mut on_progress: impl FnMut(u64),
) -> Result<IndexStats, IndexError> {
    let started = Instant::now();
    let file = File::open(corpus).map_err(io(corpus))?;
    let Target { replacement, tmp } = build_target(index_dir)?;

    let (schema, f) = schema();
    let index = Index::create_in_dir(&tmp, schema)?;
    let mut writer = index.writer::<TantivyDocument>(256 * 1024 * 1024)?;
    let mut reader = BufReader::new(file);
    let mut hasher = Sha256::new();
    let mut line = Vec::new();
    let (mut documents, mut bytes, mut line_no) = (0u64, 0u64, 0u64);
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io(corpus))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        bytes += n as u64;
        hasher.update(&line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let rec: CorpusRecord =
            serde_json::from_slice(&line).map_err(|e| IndexError::BadRecord {
                path: corpus.to_path_buf(),
                line: line_no,
                message: e.to_string(),
            })?;
        let mut doc = TantivyDocument::default();
        doc.add_text(f.id, &rec.id);
        doc.add_text(f.title, &rec.title);
        doc.add_text(f.text, &rec.text);
        if let Some(url) = &rec.url {
            doc.add_text(f.url, url);
        }
        writer.add_document(doc)?;
        documents += 1;
        if documents % 256 == 0 {
            on_progress(bytes);
        }
    }
    on_progress(bytes);
    writer.commit()?;
    let segments = index.searchable_segment_ids()?;
    if segments.len() > 1 {
        writer.merge(&segments).wait()?;
    }
    writer.wait_merging_threads()?;
    let writer = index.writer::<TantivyDocument>(16 * 1024 * 1024)?;
    writer.garbage_collect_files().wait()?;
    drop(writer);

    let manifest = Manifest {
        format: INDEX_FORMAT,
        corpus: corpus.display().to_string(),
        corpus_sha256: format!("{:x}", hasher.finalize()),
        documents,
        bytes,
    };
    let manifest_path = tmp.join(MANIFEST_FILE);
    let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    std::fs::write(&manifest_path, json + "\n").map_err(io(&manifest_path))?;
    // The old index (or an empty directory, checked above) is moved aside,
    // the new one renamed in, the old one removed: killed at any point, the
    // old or the new index is served (`Replacement::recover`).
    replacement.replace().map_err(io(index_dir))?;
    Ok(IndexStats {
        documents,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// sha256 of a file, hex.
///
/// # Errors
/// I/O errors reading `path`.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut File::open(path)?, &mut hasher)?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// The [`IndexError::Io`] for an I/O error on `path`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IndexError + '_ {
    move |error| IndexError::Io {
        path: path.to_path_buf(),
        error,
    }
}
