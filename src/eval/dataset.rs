//! QA datasets for `seeker eval`.
//!
//! - JSONL, one object per line with `question` and `answers` or
//!   `golden_answers` (FlashRAG / Search-R1 files); `id` is optional.
//! - FanOutQA JSON (`fanout-final-dev.json`, `fanoutqa==1.1.1`): a list of
//!   top-level questions with `answer` (a string, number, list or object) and a
//!   `decomposition` tree of single-hop sub-questions, each with `answer` and
//!   `evidence.title` (the Wikipedia article that answers it).
//!
//! Answers that are lists or objects become several gold strings (every leaf);
//! for FanOutQA's multi-part top-level answers that makes EM and F1, the best
//! over golds, lenient: its official scorer is different.
//!
//! A JSONL line may also say that its answers are a set to be found whole
//! rather than aliases of one answer (`"answer_is_set": true`, PhantomWiki's
//! questions as `scripts/phantomwiki.sh` writes them), and carry `difficulty`
//! (hops), `template`, `aggregation` (a "How many" question) and `support`
//! (titles of the articles the solution passes through).

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

/// One evaluation item.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QaItem {
    pub id: String,
    pub question: String,
    /// Gold answers, none empty: aliases of one answer (any one is right), or
    /// with `answer_is_set` every member of the answer.
    pub golds: Vec<String>,
    /// The golds are one answer's members, all wanted (scored by set F1,
    /// [`super::metrics::set_scores`]), not aliases.
    pub answer_is_set: bool,
    /// Title of the article holding the answer, when the dataset says.
    pub evidence_title: Option<String>,
    /// Reasoning hops (PhantomWiki's `difficulty`).
    pub difficulty: Option<u32>,
    /// The question's template (PhantomWiki's words joined by spaces).
    pub template: Option<String>,
    /// An aggregation ("How many …") question.
    pub aggregation: Option<bool>,
    /// Titles of the articles that support the answer; empty when unknown.
    pub support: Vec<String>,
}

/// How to read FanOutQA files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanoutMode {
    /// The top-level (multi-hop) questions.
    Questions,
    /// Every single-hop sub-question of the decompositions, depth first.
    Subquestions,
}

/// A dataset could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// Every leaf of a JSON answer as a string (strings, numbers, booleans).
fn leaves(answer: &Value, out: &mut Vec<String>) {
    match answer {
        Value::String(s) => {
            if !s.trim().is_empty() {
                out.push(s.trim().to_string());
            }
        }
        Value::Number(n) => out.push(n.to_string()),
        Value::Bool(b) => out.push(if *b { "yes" } else { "no" }.to_string()),
        Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
        Value::Object(map) => map.values().for_each(|v| leaves(v, out)),
        Value::Null => {}
    }
}

/// Reads `path`: FanOutQA JSON when it is a JSON array (read with `mode`),
/// otherwise JSONL.
///
/// # Errors
/// I/O errors; a line or item without a question or without any gold answer
/// (with its line or index).
pub fn load(path: &Path, mode: FanoutMode) -> Result<Vec<QaItem>, DatasetError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| DatasetError::Io {
        path: shown.clone(),
        error,
    })?;
    let invalid = |message: String| DatasetError::Invalid {
        path: shown.clone(),
        message,
    };
    if text.trim_start().starts_with('[') {
        let items: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not FanOutQA JSON: {e}")))?;
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match mode {
                FanoutMode::Questions => out.push(
                    fanout_item(item)
                        .ok_or_else(|| invalid(format!("item {i} has no question or answer")))?,
                ),
                FanoutMode::Subquestions => {
                    for sub in item["decomposition"].as_array().into_iter().flatten() {
                        collect_subquestions(sub, &mut out);
                    }
                }
            }
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| invalid(format!("line {}: not JSON: {e}", n + 1)))?;
        let question = v["question"]
            .as_str()
            .filter(|q| !q.trim().is_empty())
            .ok_or_else(|| invalid(format!("line {}: no \"question\" string", n + 1)))?;
        let mut golds = Vec::new();
        let answers = if v.get("golden_answers").is_some() {
            &v["golden_answers"]
        } else if v.get("answers").is_some() {
            &v["answers"]
        } else {
            &v["answer"]
        };
        leaves(answers, &mut golds);
        if golds.is_empty() {
            return Err(invalid(format!(
                "line {}: no \"answers\", \"golden_answers\" or \"answer\" with text",
                n + 1
            )));
        }
        let id = match &v["id"] {
            Value::String(s) => s.clone(),
            Value::Number(x) => x.to_string(),
            _ => (n + 1).to_string(),
        };
        let line = n + 1;
        let support = match &v["support"] {
            Value::Null => Vec::new(),
            Value::Array(titles) => titles
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| invalid(format!("line {line}: \"support\" must list strings")))?,
            _ => return Err(invalid(format!("line {line}: \"support\" must be a list"))),
        };
        let flag = |key: &str| match &v[key] {
            Value::Null => Ok(None),
            Value::Bool(b) => Ok(Some(*b)),
            _ => Err(invalid(format!(
                "line {line}: \"{key}\" must be true or false"
            ))),
        };
        let difficulty = match &v["difficulty"] {
            Value::Null => None,
            d => Some(
                d.as_u64()
                    .and_then(|d| u32::try_from(d).ok())
                    .ok_or_else(|| {
                        invalid(format!(
                            "line {line}: \"difficulty\" must be a whole number"
                        ))
                    })?,
            ),
        };
        out.push(QaItem {
            id,
            question: question.trim().to_string(),
            golds,
            answer_is_set: flag("answer_is_set")?.unwrap_or(false),
            difficulty,
            template: v["template"].as_str().map(str::to_string),
            aggregation: flag("aggregation")?,
            support,
            ..QaItem::default()
        });
    }
    Ok(out)
}

fn fanout_item(v: &Value) -> Option<QaItem> {
    let question = v["question"].as_str()?.trim().to_string();
    let mut golds = Vec::new();
    leaves(&v["answer"], &mut golds);
    if question.is_empty() || golds.is_empty() {
        return None;
    }
    Some(QaItem {
        id: v["id"].as_str().unwrap_or_default().to_string(),
        question,
        golds,
        evidence_title: v["evidence"]["title"].as_str().map(str::to_string),
        ..QaItem::default()
    })
}

fn collect_subquestions(v: &Value, out: &mut Vec<QaItem>) {
    if let Some(item) = fanout_item(v) {
        out.push(item);
    }
    for sub in v["decomposition"].as_array().into_iter().flatten() {
        collect_subquestions(sub, out);
    }
}

/// Keeps the items whose evidence article is one of `titles` (items without
/// an evidence title are dropped).
pub fn with_evidence_in(items: Vec<QaItem>, titles: &HashSet<String>) -> Vec<QaItem> {
    items
        .into_iter()
        .filter(|i| {
            i.evidence_title
                .as_ref()
                .is_some_and(|t| titles.contains(t))
        })
        .collect()
}

/// Keeps the items of at most `max` hops (items without a difficulty are
/// dropped) and, with `no_aggregation`, those that are not aggregation
/// questions (items that do not say are kept).
pub fn by_kind(items: Vec<QaItem>, max: Option<u32>, no_aggregation: bool) -> Vec<QaItem> {
    items
        .into_iter()
        .filter(|i| max.is_none_or(|m| i.difficulty.is_some_and(|d| d <= m)))
        .filter(|i| !no_aggregation || i.aggregation != Some(true))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_jsonl_with_either_answer_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qa.jsonl");
        std::fs::write(
            &path,
            "{\"id\": 7, \"question\": \"Who?\", \"golden_answers\": [\"A\", \"B\"]}\n\n\
             {\"question\": \" What? \", \"answers\": \"C\"}\n",
        )
        .unwrap();
        let items = load(&path, FanoutMode::Questions).unwrap();
        assert_eq!(items[0].id, "7");
        assert_eq!(items[0].golds, ["A", "B"]);
        assert_eq!(items[1].id, "3");
        assert_eq!(items[1].question, "What?");

        std::fs::write(&path, "{\"question\": \"Who?\"}\n").unwrap();
        let err = load(&path, FanoutMode::Questions).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("answers"), "{err}");
    }

    #[test]
    fn reads_phantomwiki_lines_with_their_kind_and_support() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"id": "pw1-5k-000", "question": "Who is the sister of Aida Wang?", "answers": ["Barabara Beltran", "Vicki Hackworth"], "answer_is_set": true, "difficulty": 1, "template": "Who is the <relation>_3 of <name>_4 ?", "aggregation": false, "support": ["Aida Wang"]}"#,
                "\n",
                r#"{"id": "pw1-5k-001", "question": "How many friends does Aida Wang have?", "answers": ["3"], "answer_is_set": true, "difficulty": 2, "aggregation": true, "support": []}"#,
                "\n",
                r#"{"id": "x", "question": "Who?", "answers": ["A"]}"#,
                "\n"
            ),
        )
        .unwrap();
        let items = load(&path, FanoutMode::Questions).unwrap();
        assert!(items[0].answer_is_set);
        assert_eq!(items[0].golds, ["Barabara Beltran", "Vicki Hackworth"]);
        assert_eq!(items[0].difficulty, Some(1));
        assert_eq!(items[0].support, ["Aida Wang"]);
        assert_eq!(items[1].aggregation, Some(true));
        assert!(!items[2].answer_is_set);
        assert_eq!(items[2].difficulty, None);

        let kept = by_kind(items.clone(), Some(1), false);
        assert_eq!(kept.len(), 1, "at most one hop, and a known difficulty");
        let kept = by_kind(items, None, true);
        let ids: Vec<_> = kept.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["pw1-5k-000", "x"]);

        std::fs::write(
            &path,
            r#"{"question": "Who?", "answers": ["A"], "support": "Aida"}"#,
        )
        .unwrap();
        let err = load(&path, FanoutMode::Questions).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("support"), "{err}");
        std::fs::write(
            &path,
            r#"{"question": "Who?", "answers": ["A"], "difficulty": -1}"#,
        )
        .unwrap();
        let err = load(&path, FanoutMode::Questions).unwrap_err().to_string();
        assert!(err.contains("difficulty"), "{err}");
    }

    #[test]
    fn reads_fanoutqa_questions_and_subquestions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.json");
        let data = serde_json::json!([{
            "id": "q1",
            "question": "Batting hands of the first two picks?",
            "answer": {"Pat Burrell": "Right", "Mark Mulder": "Left"},
            "decomposition": [
                {"id": "s1", "question": "First two picks?", "answer": ["Pat Burrell", "Mark Mulder"],
                 "evidence": {"title": "1998 Major League Baseball draft"}, "decomposition": []},
                {"id": "s2", "question": "Batting hand of Pat Burrell?", "answer": "Right",
                 "evidence": {"title": "Pat Burrell"}, "decomposition": []}
            ]
        }]);
        std::fs::write(&path, data.to_string()).unwrap();
        let top = load(&path, FanoutMode::Questions).unwrap();
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].golds, ["Right", "Left"]);
        let subs = load(&path, FanoutMode::Subquestions).unwrap();
        assert_eq!(subs.len(), 2);
        assert_eq!(subs[1].golds, ["Right"]);
        assert_eq!(subs[1].evidence_title.as_deref(), Some("Pat Burrell"));
        let titles: HashSet<String> = ["Pat Burrell".to_string()].into();
        assert_eq!(with_evidence_in(subs, &titles).len(), 1);
    }
}
