//! The `hybrid` backend: BM25 and dense retrieval of one query, run
//! concurrently and fused by reciprocal rank.
//!
//! Seam: built by the search setup from two [`SearchBackend`]s (the BM25
//! index's and [`super::dense::DenseBackend`]) and `[search.hybrid]`; called
//! by the dispatcher like any backend.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Document, SearchBackend, SearchError};

/// `[search.hybrid]`: how the `hybrid` backend fuses its two retrievals.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HybridConfig {
    /// Reciprocal-rank fusion constant: a document at rank `r` (from 1) of a
    /// list scores `weight / (rrf_k + r)` (Cormack et al., SIGIR 2009, use 60).
    pub rrf_k: f32,
    pub bm25_weight: f32,
    pub dense_weight: f32,
    /// Documents taken from each retrieval before fusing (at least top-k).
    pub candidates: usize,
}

impl Default for HybridConfig {
    fn default() -> Self {
        Self {
            rrf_k: 60.0,
            bm25_weight: 1.0,
            dense_weight: 1.0,
            candidates: 20,
        }
    }
}

/// The `hybrid` backend: BM25 and dense retrievals of the query run
/// concurrently, fused by reciprocal rank ([`HybridConfig`]); a document's
/// score is its fused score. When one retrieval fails the other's list is
/// returned alone; when both fail, the BM25 error.
pub struct HybridBackend {
    bm25: Arc<dyn SearchBackend>,
    dense: Arc<dyn SearchBackend>,
    config: HybridConfig,
}

impl HybridBackend {
    pub fn new(
        bm25: Arc<dyn SearchBackend>,
        dense: Arc<dyn SearchBackend>,
        config: HybridConfig,
    ) -> Self {
        Self {
            bm25,
            dense,
            config,
        }
    }
}

/// Reciprocal-rank fusion of ranked lists `(weight, documents)`; documents are
/// the same when their ids are. Ties keep the order of first appearance.
pub fn fuse(lists: &[(f32, Vec<Document>)], rrf_k: f32, k: usize) -> Vec<Document> {
    let mut scores: HashMap<&str, (f32, usize)> = HashMap::new();
    let mut docs: Vec<&Document> = Vec::new();
    for (weight, list) in lists {
        for (rank, d) in list.iter().enumerate() {
            let add = weight / (rrf_k + rank as f32 + 1.0);
            match scores.get_mut(d.id.as_str()) {
                Some((s, _)) => *s += add,
                None => {
                    scores.insert(&d.id, (add, docs.len()));
                    docs.push(d);
                }
            }
        }
    }
    let mut ranked: Vec<(f32, usize)> = scores.into_values().collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked
        .into_iter()
        .take(k)
        .map(|(score, i)| Document {
            score,
            ..docs[i].clone()
        })
        .collect()
}

#[async_trait]
impl SearchBackend for HybridBackend {
    async fn search(&self, query: &str, k: usize) -> Result<Vec<Document>, SearchError> {
        let depth = k.max(self.config.candidates);
        let (sparse, dense) = tokio::join!(
            self.bm25.search(query, depth),
            self.dense.search(query, depth)
        );
        let lists = match (sparse, dense) {
            (Ok(s), Ok(d)) => vec![(self.config.bm25_weight, s), (self.config.dense_weight, d)],
            (Ok(s), Err(e)) => {
                tracing::warn!(error = %e, "hybrid: dense retrieval failed; BM25 alone");
                vec![(self.config.bm25_weight, s)]
            }
            (Err(e), Ok(d)) => {
                tracing::warn!(error = %e, "hybrid: BM25 retrieval failed; dense alone");
                vec![(self.config.dense_weight, d)]
            }
            (Err(e), Err(_)) => return Err(e),
        };
        Ok(fuse(&lists, self.config.rrf_k, k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: &str) -> Document {
        Document {
            id: id.into(),
            title: id.into(),
            ..Document::default()
        }
    }

    #[test]
    fn fusion_rewards_documents_both_lists_rank() {
        let bm25 = vec![doc("a"), doc("b"), doc("c")];
        let dense = vec![doc("c"), doc("d"), doc("a")];
        let fused = fuse(&[(1.0, bm25), (1.0, dense)], 60.0, 3);
        let ids: Vec<&str> = fused.iter().map(|d| d.id.as_str()).collect();
        // a: 1/61 + 1/63; c: 1/63 + 1/61 (a first: seen first); then b (1/62) over d (1/62, later).
        assert_eq!(ids, ["a", "c", "b"]);
        assert!((fused[0].score - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-6);
    }

    #[test]
    fn weights_tilt_the_fusion() {
        let fused = fuse(&[(1.0, vec![doc("a")]), (3.0, vec![doc("b")])], 60.0, 2);
        assert_eq!(fused[0].id, "b");
    }
}
