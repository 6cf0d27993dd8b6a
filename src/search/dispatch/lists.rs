//! Backend lists: a `fallback` asks its members in order, each within an
//! equal share of what is left of the query's deadline; a `merge` asks them
//! all at once and fuses their lists ([`fuse`]). Each member call goes
//! through the member's own cache, limits and retries
//! ([`Dispatcher::search_one`]); a member's failure is counted under its
//! name and reported in [`QueryResult::failed_backends`].

use tokio::time::Instant;

use super::{Dispatcher, QueryResult};
use crate::search::{Document, SearchError};

/// A member of a backend list that failed one query: its name, the error's
/// bounded kind ([`SearchError::kind`]) and its message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct BackendFailure {
    /// The member's name (a `[search.backends]` key or a built-in backend).
    pub backend: String,
    /// [`SearchError::kind`]: `timeout`, `rate_limited`, `auth`, … .
    pub error_kind: &'static str,
    /// The error's message (keys redacted).
    pub error: String,
}

/// How a backend list asks its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMode {
    /// In order; the next when one fails.
    Fallback,
    /// All at once; the lists fused by reciprocal rank.
    Merge,
}

/// Reciprocal-rank constant of a `merge` (Cormack, Clarke and Büttcher,
/// "Reciprocal Rank Fusion outperforms Condorcet and individual Rank
/// Learning Methods", SIGIR 2009: k = 60).
pub const MERGE_RRF_K: f32 = 60.0;

impl Dispatcher {
    /// One query on member `member` of a list, by `until`; a failure is
    /// counted under the member's name.
    async fn ask_member(&self, member: &str, query: &str, k: usize, until: Instant) -> QueryResult {
        let limited = &self.backends[member];
        let left = until.saturating_duration_since(Instant::now());
        let limit = std::time::Duration::from_millis(left.as_micros().div_ceil(1000) as u64);
        let result =
            match tokio::time::timeout_at(until, self.search_one(member, limited, query, k, until))
                .await
            {
                Ok(result) => result,
                Err(_) => QueryResult::of(Err(SearchError::Timeout(limit)), false),
            };
        if let Err(e) = &result.result {
            self.count_failure(member, e);
        }
        result
    }

    /// One query on a backend list (see the module documentation).
    pub(super) async fn search_list<'a>(
        &'a self,
        mode: ListMode,
        members: &'a [String],
        query: &'a str,
        k: usize,
        deadline: Instant,
    ) -> QueryResult {
        let ask = |member: &'a String, until: Instant| self.ask_member(member, query, k, until);
        let failure = |member: &String, e: &SearchError| BackendFailure {
            backend: member.clone(),
            error_kind: e.kind(),
            error: e.to_string(),
        };
        match mode {
            ListMode::Fallback => {
                let mut failed = Vec::new();
                let mut last = SearchError::Backend("no backend to ask".into());
                for (i, member) in members.iter().enumerate() {
                    // An equal share of what is left, so one provider that
                    // hangs leaves time for the next.
                    let left = deadline.saturating_duration_since(Instant::now());
                    let until = Instant::now() + left / (members.len() - i) as u32;
                    let result = ask(member, until).await;
                    match result.result {
                        Ok(docs) => {
                            return QueryResult {
                                result: Ok(docs),
                                cached: result.cached,
                                failed_backends: failed,
                            }
                        }
                        Err(e) => {
                            failed.push(failure(member, &e));
                            last = e;
                        }
                    }
                }
                QueryResult {
                    result: Err(every_member_failed(last, &failed)),
                    cached: false,
                    failed_backends: failed,
                }
            }
            ListMode::Merge => {
                let results =
                    futures::future::join_all(members.iter().map(|m| ask(m, deadline))).await;
                let mut failed = Vec::new();
                let mut lists = Vec::new();
                let mut last = None;
                let cached = results.iter().all(|r| r.cached);
                for (member, result) in members.iter().zip(results) {
                    match result.result {
                        Ok(docs) => lists.push(docs),
                        Err(e) => {
                            failed.push(failure(member, &e));
                            last = Some(e);
                        }
                    }
                }
                let result = match (lists.is_empty(), last) {
                    (true, Some(e)) => Err(every_member_failed(e, &failed)),
                    _ => Ok(fuse(lists, k)),
                };
                QueryResult {
                    result,
                    cached,
                    failed_backends: failed,
                }
            }
        }
    }
}

/// The error of a list whose every member failed: the last member's when
/// all failed alike (one kind: the label stays meaningful, `rate_limited`
/// say), else a [`SearchError::Backend`] naming each member's failure.
fn every_member_failed(last: SearchError, failed: &[BackendFailure]) -> SearchError {
    if failed.iter().all(|f| f.error_kind == last.kind()) {
        return last;
    }
    let each: Vec<String> = failed
        .iter()
        .map(|f| format!("{} ({}): {}", f.backend, f.error_kind, f.error))
        .collect();
    SearchError::Backend(format!(
        "every backend of the list failed: {}",
        each.join("; ")
    ))
}

/// Reciprocal rank fusion of ranked lists: each document scores
/// Σ 1 / ([`MERGE_RRF_K`] + rank) over the lists that hold it (rank from 1),
/// keeping the copy of its best rank; documents are one per
/// [`normalise_url`] (or per backend and id without a URL); the top `k`,
/// best first (ties: the earlier list, then rank).
pub fn fuse(lists: Vec<Vec<Document>>, k: usize) -> Vec<Document> {
    let mut fused: Vec<(Document, f32, (usize, usize))> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (l, list) in lists.into_iter().enumerate() {
        for (r, doc) in list.into_iter().enumerate() {
            let key = match &doc.url {
                Some(url) => normalise_url(url),
                None => format!("{}\u{0}{}", doc.backend, doc.id),
            };
            let score = 1.0 / (MERGE_RRF_K + r as f32 + 1.0);
            match at.get(&key) {
                Some(&i) => {
                    let entry = &mut fused[i];
                    entry.1 += score;
                    if (r, l) < (entry.2 .1, entry.2 .0) {
                        entry.0 = doc;
                        entry.2 = (l, r);
                    }
                }
                None => {
                    at.insert(key, fused.len());
                    fused.push((doc, score, (l, r)));
                }
            }
        }
    }
    fused.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then(a.2 .1.cmp(&b.2 .1))
            .then(a.2 .0.cmp(&b.2 .0))
    });
    fused
        .into_iter()
        .take(k)
        .map(|(mut doc, score, _)| {
            doc.score = score;
            doc
        })
        .collect()
}

/// A URL as `merge` compares it: scheme and host lower-cased, `www.`, the
/// fragment, a default port and a trailing `/` dropped, `http` read as
/// `https`; the path and query kept as written. Text that does not parse as
/// a URL is compared trimmed.
pub fn normalise_url(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url.trim()) else {
        return url.trim().to_string();
    };
    parsed.set_fragment(None);
    let host = parsed
        .host_str()
        .map(|h| h.trim_start_matches("www.").to_lowercase())
        .unwrap_or_default();
    let scheme = match parsed.scheme() {
        "http" => "https",
        other => other,
    };
    let mut rest = parsed.path().trim_end_matches('/').to_string();
    if let Some(q) = parsed.query() {
        rest.push('?');
        rest.push_str(q);
    }
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{scheme}://{host}{port}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web(url: &str, backend: &str) -> Document {
        Document {
            id: url.into(),
            title: url.into(),
            url: Some(url.into()),
            backend: backend.into(),
            ..Document::default()
        }
    }

    #[test]
    fn urls_compare_without_scheme_www_fragment_or_trailing_slash() {
        let same = [
            "https://en.wikipedia.org/wiki/Paris",
            "http://en.wikipedia.org/wiki/Paris/",
            "https://EN.Wikipedia.org/wiki/Paris#History",
            "https://en.wikipedia.org:443/wiki/Paris",
        ];
        for url in same {
            assert_eq!(normalise_url(url), normalise_url(same[0]), "{url}");
        }
        assert_eq!(
            normalise_url("https://www.example.com/a?b=1"),
            normalise_url("https://example.com/a?b=1")
        );
        assert_ne!(
            normalise_url("https://example.com/a?b=1"),
            normalise_url("https://example.com/a?b=2")
        );
        assert_ne!(
            normalise_url("https://example.com/Paris"),
            normalise_url("https://example.com/paris"),
            "paths keep their case"
        );
    }

    #[test]
    fn a_merge_fuses_by_reciprocal_rank_and_keeps_one_copy_per_url() {
        let a = vec![
            web("https://a.org/1", "brave"),
            web("https://b.org/2", "brave"),
        ];
        let b = vec![
            web("http://b.org/2/", "serper"),
            web("https://c.org/3", "serper"),
            web("https://a.org/1#x", "serper"),
        ];
        let fused = fuse(vec![a, b], 10);
        let urls: Vec<_> = fused.iter().map(|d| d.url.clone().unwrap()).collect();
        // b.org/2: 1/62 + 1/61; a.org/1: 1/61 + 1/63; c.org/3: 1/62.
        assert_eq!(
            urls,
            ["http://b.org/2/", "https://a.org/1", "https://c.org/3"]
        );
        assert_eq!(fused[0].backend, "serper", "the copy of its best rank");
        assert!((fused[0].score - (1.0 / 62.0 + 1.0 / 61.0)).abs() < 1e-6);
        assert_eq!(fuse(vec![fused.clone()], 2).len(), 2, "top k");
    }
}
