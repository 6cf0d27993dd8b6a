//! The summary of a `seeker eval` run: means over the questions, the same by
//! difficulty (hops) and by template when the dataset says them, and the
//! terminal table.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{EvalConfig, QuestionResult};

/// Mean, median and 90th percentile.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Stats {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
}

impl Stats {
    /// Stats of `values` (nearest-rank percentiles); zeros when empty.
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(0.5),
            p90: rank(0.9),
        }
    }
}

/// The scores of a group of questions (one difficulty, one template).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Group {
    /// The difficulty (hops) or the template.
    pub key: String,
    pub questions: usize,
    /// Set F1 over the group's set-answer questions (failures score 0).
    pub set_f1: Option<f64>,
    /// EM over the group's questions EM scores (see [`Summary::em`]).
    pub em: Option<f64>,
    /// Share of the group's completed questions the model searched itself.
    pub searched: Option<f64>,
    pub searches_per_question: Option<f64>,
    /// Mean support recall of the model's own searches.
    pub support_recall: Option<f64>,
}

/// The summary of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub config: EvalConfig,
    pub dataset: String,
    /// The text put before every question (`--instruction`), when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    /// Model id the server reported.
    pub served_model: Option<String>,
    pub seeker_version: String,
    pub questions: usize,
    pub completed: usize,
    /// EM, cover-EM and token F1 (best over golds) over the questions they
    /// score: every question whose golds are aliases, and set-answer
    /// questions with a single member (a failed question scores 0). `None`
    /// when no question is of that kind.
    pub em: Option<f64>,
    pub cover_em: Option<f64>,
    pub f1: Option<f64>,
    /// How many questions EM, cover-EM and F1 cover.
    pub em_questions: usize,
    /// Set precision, recall and F1 ([`super::metrics::set_scores`]) over
    /// the set-answer questions (failures score 0); `None` without any.
    pub set_precision: Option<f64>,
    pub set_recall: Option<f64>,
    pub set_f1: Option<f64>,
    /// How many questions the set scores cover.
    pub set_questions: usize,
    /// Share of questions whose gold occurs in a spliced document.
    pub answer_recall: Option<f64>,
    /// Share of completed questions where the model wrote a search query
    /// itself (a question search made for it does not count).
    pub searched: Option<f64>,
    /// Mean share of a question's supporting articles that the model's own
    /// searches retrieved (questions that list supporting articles).
    pub support_recall: Option<f64>,
    pub searches_per_question: Option<f64>,
    pub queries_per_search: Option<f64>,
    pub rounds_per_question: Option<f64>,
    pub generated_tokens_per_question: Option<f64>,
    /// Prompt tokens read per question, all rounds together.
    pub prompt_tokens_per_question: Option<f64>,
    /// Prompt tokens prefilled per question (read less cached).
    pub prefilled_tokens_per_question: Option<f64>,
    /// `None` when no question reported one (`--no-stream`).
    pub time_to_first_token_s: Option<Stats>,
    pub seconds_per_question: Stats,
    /// Failures by kind.
    pub failures: BTreeMap<String, usize>,
    /// Wall-clock seconds of the whole run.
    pub wall_seconds: f64,
    /// The scores by difficulty (hops), in increasing order; empty when the
    /// dataset gives none.
    pub by_difficulty: Vec<Group>,
    /// The scores by question template, in template order; empty when the
    /// dataset gives none.
    pub by_template: Vec<Group>,
}

fn mean_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The mean of `field` over the completed results (`None` where absent).
fn mean_ok(
    results: &[&QuestionResult],
    field: impl Fn(&QuestionResult) -> Option<f64>,
) -> Option<f64> {
    mean_of(
        results
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| field(r)),
    )
}

fn group(key: String, results: &[&QuestionResult]) -> Group {
    Group {
        key,
        questions: results.len(),
        set_f1: mean_of(results.iter().map(|r| r.set_f1)),
        em: mean_of(results.iter().map(|r| r.em)),
        searched: mean_ok(results, |r| {
            r.queries.map(|q| if q > 0 { 1.0 } else { 0.0 })
        }),
        searches_per_question: mean_ok(results, |r| r.searches.map(|s| s as f64)),
        support_recall: mean_ok(results, |r| r.support_recall),
    }
}

/// `results` grouped by `key` (those without one left out), in key order.
fn groups<K: Ord + ToString>(
    results: &[QuestionResult],
    key: impl Fn(&QuestionResult) -> Option<K>,
) -> Vec<Group> {
    let mut by: BTreeMap<K, Vec<&QuestionResult>> = BTreeMap::new();
    for r in results {
        if let Some(k) = key(r) {
            by.entry(k).or_default().push(r);
        }
    }
    by.into_iter()
        .map(|(k, rs)| group(k.to_string(), &rs))
        .collect()
}

impl Summary {
    /// Aggregates `results`.
    pub fn new(
        config: EvalConfig,
        dataset: String,
        served_model: Option<String>,
        results: &[QuestionResult],
        wall_seconds: f64,
    ) -> Self {
        let all: Vec<&QuestionResult> = results.iter().collect();
        let ok: Vec<&QuestionResult> = results.iter().filter(|r| r.error.is_none()).collect();
        let mut failures = BTreeMap::new();
        for r in results {
            if let Some(kind) = &r.error_kind {
                *failures.entry(kind.clone()).or_insert(0) += 1;
            }
        }
        let searches: usize = ok.iter().filter_map(|r| r.searches).sum();
        let queries: usize = ok.iter().filter_map(|r| r.queries).sum();
        let has_rollouts = ok.iter().any(|r| r.searches.is_some());
        let whole = group(String::new(), &all);
        Self {
            config,
            dataset,
            instruction: None,
            served_model,
            seeker_version: env!("CARGO_PKG_VERSION").to_string(),
            questions: results.len(),
            completed: ok.len(),
            em: whole.em,
            cover_em: mean_of(results.iter().map(|r| r.cover_em)),
            f1: mean_of(results.iter().map(|r| r.f1)),
            em_questions: results.iter().filter(|r| r.em.is_some()).count(),
            set_precision: mean_of(results.iter().map(|r| r.set_precision)),
            set_recall: mean_of(results.iter().map(|r| r.set_recall)),
            set_f1: whole.set_f1,
            set_questions: results.iter().filter(|r| r.set_f1.is_some()).count(),
            answer_recall: mean_ok(&all, |r| {
                r.answer_in_documents.map(|b| if b { 1.0 } else { 0.0 })
            }),
            searched: whole.searched,
            support_recall: whole.support_recall,
            searches_per_question: whole.searches_per_question,
            queries_per_search: (has_rollouts && searches > 0)
                .then(|| queries as f64 / searches as f64),
            rounds_per_question: mean_ok(&all, |r| r.rounds.map(|s| s as f64)),
            generated_tokens_per_question: mean_ok(&all, |r| r.completion_tokens.map(|s| s as f64)),
            prompt_tokens_per_question: mean_ok(&all, |r| r.prompt_tokens.map(|s| s as f64)),
            prefilled_tokens_per_question: mean_ok(&all, |r| {
                r.prompt_tokens
                    .map(|p| p.saturating_sub(r.prompt_tokens_cached.unwrap_or(0)) as f64)
            }),
            time_to_first_token_s: Some(
                ok.iter()
                    .filter_map(|r| r.time_to_first_token_s)
                    .collect::<Vec<_>>(),
            )
            .filter(|t| !t.is_empty())
            .map(|t| Stats::of(&t)),
            seconds_per_question: Stats::of(&ok.iter().map(|r| r.seconds).collect::<Vec<_>>()),
            failures,
            wall_seconds,
            by_difficulty: groups(results, |r| r.difficulty),
            by_template: groups(results, |r| r.template.clone()),
        }
    }

    /// The terminal table: the run's figures, then (when the dataset gives
    /// them) the scores by difficulty and by template.
    pub fn table(&self) -> String {
        let opt = |v: Option<f64>, digits: usize| {
            v.map_or_else(|| "n/a".to_string(), |x| format!("{x:.digits$}"))
        };
        let mut rows: Vec<(String, String)> = vec![(
            "questions".into(),
            format!("{} ({} completed)", self.questions, self.completed),
        )];
        if self.set_questions > 0 {
            rows.push((
                "set F1 (precision / recall)".into(),
                format!(
                    "{} ({} / {}) over {} set answers",
                    opt(self.set_f1, 3),
                    opt(self.set_precision, 3),
                    opt(self.set_recall, 3),
                    self.set_questions
                ),
            ));
        }
        let over = if self.set_questions > 0 {
            format!(" (over {} single answers)", self.em_questions)
        } else {
            String::new()
        };
        rows.extend([
            ("EM".into(), format!("{}{over}", opt(self.em, 3))),
            ("cover-EM".into(), opt(self.cover_em, 3)),
            ("F1".into(), opt(self.f1, 3)),
            (
                "answer recall of spliced documents".into(),
                opt(self.answer_recall, 3),
            ),
            ("searched by the model".into(), opt(self.searched, 3)),
        ]);
        if self.support_recall.is_some() {
            rows.push((
                "support recall of its searches".into(),
                opt(self.support_recall, 3),
            ));
        }
        rows.extend([
            (
                "searches / question".into(),
                opt(self.searches_per_question, 2),
            ),
            ("queries / search".into(), opt(self.queries_per_search, 2)),
            ("rounds / question".into(), opt(self.rounds_per_question, 2)),
            (
                "generated tokens / question".into(),
                opt(self.generated_tokens_per_question, 1),
            ),
            (
                "prompt tokens / question".into(),
                opt(self.prompt_tokens_per_question, 1),
            ),
            (
                "prefilled tokens / question".into(),
                opt(self.prefilled_tokens_per_question, 1),
            ),
        ]);
        for (name, s) in [
            ("time to first token (s)", self.time_to_first_token_s),
            ("seconds / question", Some(self.seconds_per_question)),
        ] {
            rows.push((
                name.into(),
                s.map_or_else(
                    || "n/a (not streamed)".to_string(),
                    |s| format!("mean {:.2}, p50 {:.2}, p90 {:.2}", s.mean, s.p50, s.p90),
                ),
            ));
        }
        let failures = if self.failures.is_empty() {
            "none".to_string()
        } else {
            self.failures
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        rows.push(("failures".into(), failures));
        rows.push(("wall time (s)".into(), format!("{:.1}", self.wall_seconds)));
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out: String = rows
            .iter()
            .map(|(k, v)| format!("{k:width$}  {v}\n"))
            .collect();
        for (title, groups) in [
            ("difficulty", &self.by_difficulty),
            ("template", &self.by_template),
        ] {
            if !groups.is_empty() {
                out.push('\n');
                out.push_str(&group_table(title, groups));
            }
        }
        out
    }
}

/// One group table: a row per group with its count and scores.
fn group_table(title: &str, groups: &[Group]) -> String {
    let opt = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "n/a".to_string(), |x| format!("{x:.digits$}"))
    };
    let width = groups
        .iter()
        .map(|g| g.key.chars().count())
        .chain([title.len()])
        .max()
        .unwrap_or(0);
    let mut out = format!(
        "{title:width$}  {:>9}  {:>6}  {:>5}  {:>8}  {:>10}  {:>7}\n",
        "questions", "set F1", "EM", "searched", "searches/q", "support"
    );
    for g in groups {
        out.push_str(&format!(
            "{:width$}  {:>9}  {:>6}  {:>5}  {:>8}  {:>10}  {:>7}\n",
            g.key,
            g.questions,
            opt(g.set_f1, 3),
            opt(g.em, 2),
            opt(g.searched, 2),
            opt(g.searches_per_question, 2),
            opt(g.support_recall, 2),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_use_nearest_rank_percentiles() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0, 10.0]);
        assert_eq!(s.mean, 4.0);
        assert_eq!(s.p50, 3.0);
        assert_eq!(s.p90, 10.0);
        assert_eq!(Stats::of(&[]), Stats::default());
    }

    fn result(
        difficulty: u32,
        set_f1: Option<f64>,
        em: Option<f64>,
        queries: usize,
    ) -> QuestionResult {
        QuestionResult {
            difficulty: Some(difficulty),
            template: Some(format!("t{}", difficulty % 2)),
            set_f1,
            set_precision: set_f1,
            set_recall: set_f1,
            em,
            cover_em: em,
            f1: em,
            queries: Some(queries),
            searches: Some(queries),
            support_recall: Some(if queries > 0 { 0.5 } else { 0.0 }),
            ..QuestionResult::default()
        }
    }

    #[test]
    fn set_scores_and_em_cover_their_own_questions_and_groups_split_them() {
        let results = [
            result(1, Some(1.0), Some(1.0), 1),
            result(1, Some(0.5), None, 2),
            result(2, Some(0.0), None, 0),
            QuestionResult {
                error: Some("deadline".into()),
                error_kind: Some("timeout".into()),
                set_f1: Some(0.0),
                em: Some(0.0),
                difficulty: Some(2),
                ..QuestionResult::default()
            },
        ];
        let s = Summary::new(
            EvalConfig::default(),
            "pw.jsonl".into(),
            None,
            &results,
            1.0,
        );
        assert_eq!(s.set_questions, 4);
        assert_eq!(s.set_f1, Some(1.5 / 4.0), "a failure scores 0");
        assert_eq!(s.em_questions, 2);
        assert_eq!(s.em, Some(0.5));
        assert_eq!(s.searched, Some(2.0 / 3.0), "over completed questions");
        let keys: Vec<_> = s.by_difficulty.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["1", "2"]);
        assert_eq!(s.by_difficulty[0].set_f1, Some(0.75));
        assert_eq!(s.by_difficulty[1].questions, 2);
        assert_eq!(s.by_difficulty[1].searched, Some(0.0));
        assert_eq!(s.by_template.len(), 2);
        let table = s.table();
        assert!(
            table.contains("0.375 (0.500 / 0.500) over 4 set answers"),
            "{table}"
        );
        assert!(table.contains("over 2 single answers"), "{table}");
        assert!(table.contains("difficulty  questions"), "{table}");
    }

    #[test]
    fn alias_datasets_keep_the_plain_table() {
        let results = [QuestionResult {
            em: Some(1.0),
            cover_em: Some(1.0),
            f1: Some(1.0),
            ..QuestionResult::default()
        }];
        let s = Summary::new(
            EvalConfig::default(),
            "qa.jsonl".into(),
            None,
            &results,
            1.0,
        );
        assert_eq!((s.set_f1, s.set_questions), (None, 0));
        let table = s.table();
        assert!(
            !table.contains("set F1") && !table.contains("difficulty"),
            "{table}"
        );
        assert!(
            table.contains("EM  1.000\n") || table.contains("1.000\n"),
            "{table}"
        );
    }
}
