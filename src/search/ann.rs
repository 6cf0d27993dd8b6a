//! The approximate dense index: an HNSW graph (Malkov & Yashunin 2018, the
//! `hnsw_rs` crate) over the dense vectors, built by `seeker index --dense`
//! when the corpus has more rows than `search.dense.approximate_above`, and
//! searched instead of the exact matrix product. `bench/README.md` ("Dense
//! search at scale") has the measurements that chose the threshold and the
//! parameters.
//!
//! Files, inside `<index>/dense`: `hnsw.hnsw.graph` and `hnsw.hnsw.data`
//! (`hnsw_rs`'s dump format, the vectors included); the manifest records the
//! build parameters ([`HnswParams`]).

use std::path::Path;

use hnsw_rs::api::AnnT;
use hnsw_rs::hnswio::HnswIo;
use hnsw_rs::prelude::{DistDot, Hnsw};
use serde::{Deserialize, Serialize};

/// The dump's base name inside the dense directory.
const BASENAME: &str = "hnsw";

/// How the graph is built (recorded in the dense manifest).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HnswParams {
    /// Links per node (HNSW's `M`).
    pub m: usize,
    /// Candidates considered while inserting (`efConstruction`).
    pub ef_construction: usize,
}

impl Default for HnswParams {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construction: 100,
        }
    }
}

/// Errors building or loading the graph.
#[derive(Debug, thiserror::Error)]
#[error("approximate index: {0}")]
pub struct AnnError(String);

/// Builds the graph over `vectors` (`rows × dim` unit-length floats) with all
/// cores and writes it into `dir`. `on_progress(done, total)` follows each
/// chunk of insertions.
///
/// # Errors
/// Writing the dump.
pub fn build(
    vectors: &[f32],
    dim: usize,
    params: HnswParams,
    dir: &Path,
    on_progress: impl Fn(usize, usize),
) -> Result<(), AnnError> {
    let rows = vectors.len() / dim.max(1);
    // hnsw_rs dumps only graphs made with its maximum of 16 layers; the
    // levels drawn still follow ln(rows) (its level scale is 1/ln(m)).
    let hnsw = Hnsw::<f32, DistDot>::new(params.m, rows, 16, params.ef_construction, DistDot {});
    let all: Vec<(&[f32], usize)> = vectors
        .chunks_exact(dim)
        .enumerate()
        .map(|(i, v)| (v, i))
        .collect();
    // All cores, whatever RAYON_NUM_THREADS says (the embedding phase before
    // sets it to 1 for candle).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cores)
        .build()
        .map_err(|e| AnnError(format!("thread pool: {e}")))?;
    let mut done = 0;
    for chunk in all.chunks(10_000) {
        pool.install(|| hnsw.parallel_insert_slice(&chunk.to_vec()));
        done += chunk.len();
        on_progress(done, rows);
    }
    let written = hnsw
        .file_dump(dir, BASENAME)
        .map_err(|e| AnnError(format!("writing {}: {e:#}", dir.display())))?;
    if written != BASENAME {
        return Err(AnnError(format!(
            "{} already held a graph dump (wrote {written} instead)",
            dir.display()
        )));
    }
    Ok(())
}

/// A loaded graph, searched with `ef` candidates (at least k).
pub struct Approximate {
    graph: Hnsw<'static, f32, DistDot>,
    ef: usize,
}

impl Approximate {
    /// Loads the graph `build` wrote into `dir`. The loader `hnsw_rs` ties the
    /// graph's lifetime to stays allocated for the life of the process (a few
    /// hundred bytes; an index is opened once at start).
    ///
    /// # Errors
    /// Missing or unreadable dump files.
    pub fn open(dir: &Path, ef: usize) -> Result<Self, AnnError> {
        for suffix in ["graph", "data"] {
            let path = dir.join(format!("{BASENAME}.hnsw.{suffix}"));
            if !path.is_file() {
                return Err(AnnError(format!("{} is missing", path.display())));
            }
        }
        let io: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, BASENAME)));
        let mut graph: Hnsw<'static, f32, DistDot> = io
            .load_hnsw()
            .map_err(|e| AnnError(format!("loading {}: {e:#}", dir.display())))?;
        graph.set_searching_mode(true);
        Ok(Self { graph, ef })
    }

    /// Rows in the graph.
    pub fn rows(&self) -> usize {
        self.graph.get_nb_point()
    }

    /// The `k` nearest rows to `query` by inner product, best first, with
    /// their inner products.
    pub fn search(&self, query: &[f32], k: usize) -> Vec<(usize, f32)> {
        let mut hits: Vec<(usize, f32)> = self
            .graph
            .search(query, k, self.ef.max(k))
            .into_iter()
            .map(|n| (n.d_id, 1.0 - n.distance))
            .collect();
        hits.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        hits.truncate(k);
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit vectors in 8 dimensions around 4 directions.
    fn vectors(n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(n * 8);
        for i in 0..n {
            let mut v: Vec<f32> = (0..8)
                .map(|d| {
                    if d == i % 4 {
                        1.0
                    } else {
                        ((i * 7 + d * 13) % 17) as f32 / 100.0
                    }
                })
                .collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
            out.extend(v);
        }
        out
    }

    #[test]
    fn a_built_graph_reloads_and_finds_what_exact_search_finds() {
        let dir = tempfile::tempdir().unwrap();
        let v = vectors(2_000);
        build(&v, 8, HnswParams::default(), dir.path(), |_, _| {}).unwrap();
        let ann = Approximate::open(dir.path(), 64).unwrap();
        assert_eq!(ann.rows(), 2_000);
        let query = &v[8 * 5..8 * 6];
        let exact = {
            let mut all: Vec<(usize, f32)> = v
                .chunks_exact(8)
                .enumerate()
                .map(|(i, r)| (i, r.iter().zip(query).map(|(a, b)| a * b).sum()))
                .collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            all
        };
        let got = ann.search(query, 10);
        assert_eq!(got.len(), 10);
        // The vectors repeat (rows 68 apart are equal), so recall is judged
        // by score: a hit is as good as exact search's tenth.
        assert!(
            (got[0].1 - 1.0).abs() < 1e-5,
            "a stored vector finds its equals: {got:?}"
        );
        let tenth = exact[9].1;
        let found = got.iter().filter(|h| h.1 >= tenth - 1e-6).count();
        assert!(
            found >= 9,
            "recall@10 {found}/10: {got:?} vs {:?}",
            &exact[..10]
        );
        for (row, score) in &got {
            let want: f32 = v[row * 8..(row + 1) * 8]
                .iter()
                .zip(query)
                .map(|(a, b)| a * b)
                .sum();
            assert!(
                (score - want).abs() < 1e-5,
                "score of row {row} is its inner product"
            );
        }
        assert!(got.windows(2).all(|w| w[0].1 >= w[1].1), "best first");
        assert!(Approximate::open(&dir.path().join("nope"), 64).is_err());
    }
}
