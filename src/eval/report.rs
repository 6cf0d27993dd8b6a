//! `seeker report`: evaluation runs as pictures. Reads the per-question
//! JSONL of one or more `seeker eval --out` runs (and each one's
//! `.summary.json`, for its policy and backend) and writes to a directory:
//! `report.html` (self-contained: every plot inline as SVG, no script, no
//! network) and each plot as an SVG file:
//! - `scores.svg`: per run, the mean score (set F1 where the question has a
//!   set answer, else token F1; a failed question scores 0), EM, the share
//!   of questions searched, the share whose spliced documents hold a gold
//!   answer, and the supporting-article recall;
//! - `by_difficulty.svg`: the mean score by hops (datasets that give them);
//! - `searches.svg`: the share of questions by number of searches;
//! - `latency.svg`: the distribution (CDF) of seconds per completed
//!   question, as a share of all the run's questions (failed ones never
//!   arrive);
//! - `compare.svg` (exactly two runs): per question, which run scored higher.
//!
//! Plots are drawn by [`super::plot`]. Runs with the same `policy · backend`
//! are told apart by their file's directory (and name, if need be); a run keeps its colour
//! in every plot. A line that is not a question result (no `id`, a score
//! outside 0..=1, negative seconds), the same file twice, or an `--out` that
//! is a file are errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::page::html;
use super::plot::{grouped_bars, lines, LineStyle, Series};
use super::QuestionResult;

/// One evaluation run: its label and its questions.
#[derive(Clone, Debug)]
pub struct Run {
    /// `policy · backend` from the run's summary, else the file name.
    pub label: String,
    /// The file it was read from.
    pub path: PathBuf,
    /// Its questions, in file order.
    pub results: Vec<QuestionResult>,
}

/// Errors of reading runs and writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}, line {line}: not a `seeker eval` result")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{0}: holds no question")]
    Empty(PathBuf),
    #[error("{path}, line {line}: not a `seeker eval` result: {why}")]
    Invalid {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("drawing {plot}: {message}")]
    Draw { plot: &'static str, message: String },
    #[error("{0} is given twice")]
    Twice(PathBuf),
    #[error("{0} is a file, not a directory for the report")]
    NotADirectory(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a run: `path` is a `seeker eval --out` JSONL; its label comes from
/// `<stem>.summary.json` beside it when that exists.
///
/// # Errors
/// An unreadable file, a line that is not a question result, no question.
pub fn read_run(path: &Path) -> Result<Run, ReportError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let mut results = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let result: QuestionResult =
            serde_json::from_str(line).map_err(|source| ReportError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })?;
        let scores = [result.em, result.cover_em, result.f1, result.set_f1];
        let invalid = if result.id.is_empty() {
            Some("it has no `id`".to_string())
        } else if let Some(v) = scores.iter().flatten().find(|v| !(0.0..=1.0).contains(*v)) {
            Some(format!("a score of {v} is outside 0..=1"))
        } else if !(result.seconds.is_finite() && result.seconds >= 0.0) {
            Some(format!("`seconds` is {}", result.seconds))
        } else {
            None
        };
        if let Some(why) = invalid {
            return Err(ReportError::Invalid {
                path: path.to_path_buf(),
                line: i + 1,
                why,
            });
        }
        results.push(result);
    }
    if results.is_empty() {
        return Err(ReportError::Empty(path.to_path_buf()));
    }
    let summary = path.with_extension("summary.json");
    let parsed = std::fs::read(&summary)
        .ok()
        .map(|b| serde_json::from_slice::<serde_json::Value>(&b));
    if let Some(Err(e)) = &parsed {
        tracing::warn!(summary = %summary.display(), error = %e, "unreadable summary; the run is named by its file");
    }
    let label = parsed
        .and_then(Result::ok)
        .and_then(|v| {
            let config = &v["config"];
            let policy = config["policy"].as_str()?;
            Some(match config["backend"].as_str() {
                Some(backend) => format!("{policy} · {backend}"),
                None => policy.to_string(),
            })
        })
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
    Ok(Run {
        label,
        path: path.to_path_buf(),
        results,
    })
}

/// A question's score: set F1 for a set answer, else token F1; 0 for a
/// failed question or one no metric scores.
pub fn score(r: &QuestionResult) -> f64 {
    if r.error.is_some() {
        return 0.0;
    }
    r.set_f1.or(r.f1).unwrap_or(0.0)
}

pub(super) fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The bars of `scores.svg` for a run: (metric, value), absent where the
/// run has no data for it.
pub(super) fn headline(run: &Run) -> Vec<(&'static str, Option<f64>)> {
    let r = &run.results;
    let done = || r.iter().filter(|q| q.error.is_none());
    vec![
        ("score", mean(r.iter().map(score))),
        (
            "EM",
            mean(r.iter().filter_map(|q| match q.error {
                Some(_) if q.em.is_some() || q.set_f1.is_none() => Some(0.0),
                _ => q.em,
            })),
        ),
        (
            "searched",
            mean(done().filter_map(|q| q.queries.map(|n| f64::from(u8::from(n > 0))))),
        ),
        (
            "answer in docs",
            mean(
                r.iter()
                    .filter_map(|q| q.answer_in_documents.map(|b| f64::from(u8::from(b)))),
            ),
        ),
        (
            "support recall",
            mean(r.iter().filter_map(|q| q.support_recall)),
        ),
    ]
}

/// One plot of the report: its file name, title and SVG.
#[derive(Clone, Debug)]
pub struct Plot {
    /// Its file name in the report directory (`scores.svg`).
    pub file: &'static str,
    /// Its heading on the page.
    pub title: &'static str,
    /// The SVG document.
    pub svg: String,
}

/// The report's plots for `runs` (see the module documentation).
///
/// # Errors
/// [`ReportError::Draw`] when plotters cannot draw one.
pub fn plots(runs: &[Run]) -> Result<Vec<Plot>, ReportError> {
    let mut plots = Vec::new();
    let metrics: Vec<String> = headline(&runs[0])
        .iter()
        .map(|(m, _)| m.to_string())
        .collect();
    let series: Vec<Series<Vec<Option<f64>>>> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            run: i,
            name: r.label.clone(),
            values: headline(r).into_iter().map(|(_, v)| v).collect(),
        })
        .collect();
    plots.push(Plot {
        file: "scores.svg",
        title: "Scores by run",
        svg: grouped_bars(
            "scores.svg",
            "Scores by run",
            "mean",
            &metrics,
            &series,
            1.0,
        )?,
    });

    // By difficulty (hops), where the dataset gives it.
    let by_difficulty: Vec<Series<Vec<(f64, f64)>>> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut groups: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
            for q in &r.results {
                if let Some(d) = q.difficulty {
                    groups.entry(d).or_default().push(score(q));
                }
            }
            let points: Vec<(f64, f64)> = groups
                .into_iter()
                .map(|(d, s)| (f64::from(d), mean(s.into_iter()).unwrap_or(0.0)))
                .collect();
            Series {
                run: i,
                name: r.label.clone(),
                values: points,
            }
        })
        .filter(|s| !s.values.is_empty())
        .collect();
    if !by_difficulty.is_empty() {
        let xs = by_difficulty
            .iter()
            .flat_map(|s| s.values.iter().map(|(x, _)| *x));
        let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        plots.push(Plot {
            file: "by_difficulty.svg",
            title: "Score by difficulty",
            svg: lines(
                "by_difficulty.svg",
                "Score by difficulty (hops)",
                ("hops", "mean score"),
                &by_difficulty,
                ((lo - 0.25)..(hi + 0.25), 0.0..1.0),
                LineStyle {
                    markers: true,
                    whole_x: true,
                },
            )?,
        });
    }

    // Searches per question.
    let cap = 8usize;
    let most = runs
        .iter()
        .flat_map(|r| r.results.iter().filter_map(|q| q.searches))
        .max()
        .unwrap_or(0)
        .min(cap);
    let counts: Vec<String> = (0..=most)
        .map(|n| {
            if n == cap {
                format!("{n}+")
            } else {
                n.to_string()
            }
        })
        .collect();
    let shares: Vec<Series<Vec<Option<f64>>>> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let known: Vec<usize> = r.results.iter().filter_map(|q| q.searches).collect();
            let share = |n: usize| {
                (!known.is_empty()).then(|| {
                    known.iter().filter(|&&s| s.min(cap) == n).count() as f64 / known.len() as f64
                })
            };
            Series {
                run: i,
                name: r.label.clone(),
                values: (0..=most).map(share).collect(),
            }
        })
        .collect();
    plots.push(Plot {
        file: "searches.svg",
        title: "Searches per question",
        svg: grouped_bars(
            "searches.svg",
            "Searches per question",
            "share of questions",
            &counts,
            &shares,
            1.0,
        )?,
    });

    // Seconds per completed question, as a CDF over the run's questions
    // (failed ones never reach 1: a run that failed half its questions
    // tops out at 0.5).
    let cdfs: Vec<Series<Vec<(f64, f64)>>> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut s: Vec<f64> = r
                .results
                .iter()
                .filter(|q| q.error.is_none() && q.seconds.is_finite())
                .map(|q| q.seconds)
                .collect();
            s.sort_by(f64::total_cmp);
            let n = r.results.len() as f64;
            let points = s
                .iter()
                .enumerate()
                .map(|(k, &x)| (x, (k + 1) as f64 / n))
                .collect();
            Series {
                run: i,
                name: r.label.clone(),
                values: points,
            }
        })
        .collect();
    let slowest = cdfs
        .iter()
        .flat_map(|s| s.values.iter().map(|(x, _)| *x))
        .fold(0.0f64, f64::max);
    plots.push(Plot {
        file: "latency.svg",
        title: "Seconds per question",
        svg: lines(
            "latency.svg",
            "Seconds per question (share of all answered within)",
            ("seconds", "share of questions"),
            &cdfs,
            (0.0..(slowest * 1.05).max(1.0), 0.0..1.0),
            LineStyle {
                markers: false,
                whole_x: false,
            },
        )?,
    });

    if let [a, b] = runs {
        let outcome = compare(a, b);
        if outcome.a_higher + outcome.b_higher + outcome.same == 0 {
            // No question in both runs: nothing to compare (the page says so).
            return Ok(plots);
        }
        let groups = vec![
            format!("{} higher", short(&a.label)),
            format!("{} higher", short(&b.label)),
            "same score".to_string(),
        ];
        let total = (outcome.a_higher + outcome.b_higher + outcome.same).max(1) as f64;
        let series = vec![Series {
            run: 0,
            name: "questions in both runs".to_string(),
            values: vec![
                Some(outcome.a_higher as f64 / total),
                Some(outcome.b_higher as f64 / total),
                Some(outcome.same as f64 / total),
            ],
        }];
        plots.push(Plot {
            file: "compare.svg",
            title: "Run against run",
            svg: grouped_bars(
                "compare.svg",
                "Per question: which run scored higher",
                "share of questions",
                &groups,
                &series,
                1.0,
            )?,
        });
    }
    Ok(plots)
}

fn short(label: &str) -> String {
    match label.char_indices().nth(28) {
        Some((at, _)) => format!("{}…", &label[..at]),
        None => label.to_string(),
    }
}

/// Two runs question by question (matched by id): how often each scored
/// higher, or the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Questions the first run scored higher on.
    pub a_higher: usize,
    /// Questions the second run scored higher on.
    pub b_higher: usize,
    /// Questions both scored the same on (within 1e-9).
    pub same: usize,
}

/// Compares `a` and `b` on the questions both hold (by id).
pub fn compare(a: &Run, b: &Run) -> Comparison {
    let b_scores: BTreeMap<&str, f64> = b
        .results
        .iter()
        .map(|q| (q.id.as_str(), score(q)))
        .collect();
    let mut c = Comparison::default();
    for q in &a.results {
        let Some(&sb) = b_scores.get(q.id.as_str()) else {
            continue;
        };
        let sa = score(q);
        if (sa - sb).abs() < 1e-9 {
            c.same += 1;
        } else if sa > sb {
            c.a_higher += 1;
        } else {
            c.b_higher += 1;
        }
    }
    c
}

/// Refuses a report directory that exists as something else (a file).
///
/// # Errors
/// [`ReportError::NotADirectory`].
pub fn check_dir(dir: &Path) -> Result<(), ReportError> {
    if dir.exists() && !dir.is_dir() {
        return Err(ReportError::NotADirectory(dir.to_path_buf()));
    }
    Ok(())
}

/// `runs` with labels told apart: runs whose `policy · backend` is the same
/// get their file's directory after it (`rag · tantivy (seed2-5k)`), or
/// directory and file name when the directories do not tell them apart.
fn distinct_labels(mut runs: Vec<Run>) -> Vec<Run> {
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let dir = |r: &Run| {
        r.path
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let place = |r: &Run| {
        let stem = r
            .path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match dir(r) {
            d if d.is_empty() => stem,
            d => format!("{d}/{stem}"),
        }
    };
    let dirs: Vec<String> = runs.iter().map(dir).collect();
    let places: Vec<String> = runs.iter().map(place).collect();
    for (i, run) in runs.iter_mut().enumerate() {
        let clashing: Vec<usize> = (0..labels.len())
            .filter(|&j| labels[j] == labels[i])
            .collect();
        if clashing.len() < 2 {
            continue;
        }
        let dirs_differ = clashing
            .iter()
            .all(|&j| clashing.iter().filter(|&&k| dirs[k] == dirs[j]).count() == 1);
        let suffix = if dirs_differ && !dirs[i].is_empty() {
            dirs[i].clone()
        } else {
            places[i].clone()
        };
        run.label = format!("{} ({suffix})", run.label);
    }
    runs
}

/// Writes `report.html` and every plot's SVG into `dir` (created if
/// missing); the files written.
///
/// # Errors
/// No run, a plot that cannot be drawn, a file that cannot be written.
pub fn write(runs: &[Run], dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    if runs.is_empty() {
        return Err(ReportError::Empty(dir.to_path_buf()));
    }
    for (i, run) in runs.iter().enumerate() {
        if runs[..i].iter().any(|r| r.path == run.path) {
            return Err(ReportError::Twice(run.path.clone()));
        }
    }
    check_dir(dir)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let runs = &distinct_labels(runs.to_vec());
    let plots = plots(runs)?;
    let mut written = Vec::new();
    for plot in &plots {
        let path = dir.join(plot.file);
        std::fs::write(&path, &plot.svg).map_err(io(&path))?;
        written.push(path);
    }
    let page = dir.join("report.html");
    std::fs::write(&page, html(runs, &plots)).map_err(io(&page))?;
    written.push(page);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(id: &str, f1: f64, searches: usize, hops: u32, seconds: f64) -> QuestionResult {
        QuestionResult {
            id: id.into(),
            set_f1: Some(f1),
            em: Some(f64::from(u8::from(f1 == 1.0))),
            searches: Some(searches),
            queries: Some(searches),
            difficulty: Some(hops),
            answer_in_documents: Some(f1 > 0.0),
            seconds,
            ..QuestionResult::default()
        }
    }

    fn run(label: &str, scores: &[f64]) -> Run {
        Run {
            label: label.into(),
            path: PathBuf::from(format!("{label}.jsonl")),
            results: scores
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    question(
                        &format!("q{i}"),
                        s,
                        i % 3,
                        1 + (i % 3) as u32,
                        1.0 + i as f64,
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn two_runs_give_every_plot_and_a_self_contained_page() {
        let a = run("rag · tantivy", &[1.0, 0.5, 0.0, 0.0]);
        let mut b = run("<tool-search> · tantivy", &[1.0, 1.0, 0.0, 1.0]);
        b.results[2].error = Some("timed out".into());
        let dir = tempfile::tempdir().unwrap();
        let written = write(&[a.clone(), b.clone()], dir.path()).unwrap();
        let names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "scores.svg",
                "by_difficulty.svg",
                "searches.svg",
                "latency.svg",
                "compare.svg",
                "report.html"
            ]
        );
        let page = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert_eq!(page.matches("<svg").count(), 5, "every plot inline");
        assert!(
            !page.contains("<script") && !page.contains("src=\"http"),
            "self-contained"
        );
        assert!(page.contains("&lt;tool-search&gt;"), "labels escaped");
        // b higher on q1 and q3, the same on q0 and q2 (0 and a failure).
        assert_eq!(
            compare(&a, &b),
            Comparison {
                a_higher: 0,
                b_higher: 2,
                same: 2
            }
        );
        assert!(page.contains("higher on 2, the same on 2"), "{page}");
        let scores = std::fs::read_to_string(dir.path().join("scores.svg")).unwrap();
        assert!(scores.contains("rag · tantivy") && scores.contains("support recall"));
    }

    #[test]
    fn runs_are_told_apart_and_nothing_is_compared_without_shared_questions() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = run("rag · tantivy", &[1.0, 0.0]);
        a.path = PathBuf::from("seed1/rag.tantivy.jsonl");
        let mut b = run("rag · tantivy", &[0.5]);
        b.path = PathBuf::from("seed2/rag.tantivy.jsonl");
        for q in &mut b.results {
            q.id = format!("other-{}", q.id);
        }
        let written = write(&[a.clone(), b], dir.path()).unwrap();
        assert!(!written.iter().any(|p| p.ends_with("compare.svg")));
        let page = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert!(page.contains("rag · tantivy (seed1)"), "{page}");
        assert!(page.contains("rag · tantivy (seed2)"), "{page}");
        assert!(page.contains("share no question"), "{page}");
        let e = write(&[a.clone(), a], dir.path()).unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
        let file = dir.path().join("report.html");
        let e = write(&[run("x", &[1.0])], &file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn scores_read_set_f1_then_f1_and_failures_score_zero() {
        let mut q = QuestionResult {
            f1: Some(0.4),
            ..QuestionResult::default()
        };
        assert_eq!(score(&q), 0.4);
        q.set_f1 = Some(0.7);
        assert_eq!(score(&q), 0.7);
        q.error = Some("x".into());
        assert_eq!(score(&q), 0.0);
    }

    #[test]
    fn a_run_reads_its_label_from_the_summary_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, "{\"id\": \"q1\", \"seconds\": 2.0, \"f1\": 1.0}\n\n").unwrap();
        std::fs::write(
            dir.path().join("r.summary.json"),
            "{\"config\": {\"policy\": \"search-r1\", \"backend\": \"hybrid\"}}",
        )
        .unwrap();
        let run = read_run(&path).unwrap();
        assert_eq!(run.label, "search-r1 · hybrid");
        assert_eq!(run.results.len(), 1);
        std::fs::write(&path, "{\"id\": \"q1\"}\nnot json\n").unwrap();
        let e = read_run(&path).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        for (line, says) in [
            ("{\"seconds\": 1.0}", "no `id`"),
            ("{\"id\": \"q\", \"set_f1\": 7.5}", "outside 0..=1"),
            ("{\"id\": \"q\", \"seconds\": -1.0}", "`seconds` is -1"),
        ] {
            std::fs::write(&path, format!("{line}\n")).unwrap();
            let e = read_run(&path).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("line 1"), "{line}: {e}");
        }
        std::fs::write(&path, "\n").unwrap();
        assert!(read_run(&path)
            .unwrap_err()
            .to_string()
            .contains("no question"));
    }
}
