//! `seeker report`'s page ([`super::report`]): `report.html`, one table of
//! the runs (questions, failures, score, EM, searched, answer in docs,
//! support recall, searches and seconds per question), the comparison of two
//! runs in words, and every plot inline as SVG; every text escaped, no
//! script, nothing fetched.

use std::collections::BTreeMap;

use super::report::{compare, headline, mean, Plot, Run};

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.3}"))
}

/// The HTML page: a table of the runs, every plot inline.
pub(super) fn html(runs: &[Run], plots: &[Plot]) -> String {
    use html_escape::encode_text as esc;
    let mut out = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>seeker evaluation report</title>\n<style>\
         body{font-family:sans-serif;margin:2em auto;max-width:820px;color:#222}\
         table{border-collapse:collapse;font-size:14px;margin:1em 0}\
         th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}\
         th:first-child,td:first-child{text-align:left}\
         figure{margin:1.5em 0}figcaption{font-weight:bold;margin-bottom:.3em}\
         </style></head><body>\n<h1>seeker evaluation report</h1>\n",
    );
    out.push_str(
        "<table><thead><tr><th>run</th><th>questions</th><th>failed</th><th>score</th>\
         <th>EM</th><th>searched</th><th>answer in docs</th><th>support recall</th>\
         <th>searches / q</th><th>s / q (mean)</th></tr></thead><tbody>\n",
    );
    for run in runs {
        let h: BTreeMap<&str, Option<f64>> = headline(run).into_iter().collect();
        let failed = run.results.iter().filter(|q| q.error.is_some()).count();
        let searches = mean(
            run.results
                .iter()
                .filter_map(|q| q.searches.map(|s| s as f64)),
        );
        let seconds = mean(run.results.iter().map(|q| q.seconds));
        out.push_str(&format!(
            "<tr><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            html_escape::encode_double_quoted_attribute(&run.path.display().to_string()),
            esc(&run.label),
            run.results.len(),
            failed,
            cell(h["score"]),
            cell(h["EM"]),
            cell(h["searched"]),
            cell(h["answer in docs"]),
            cell(h["support recall"]),
            searches.map_or_else(|| "–".into(), |v| format!("{v:.2}")),
            seconds.map_or_else(|| "–".into(), |v| format!("{v:.1}")),
        ));
    }
    out.push_str("</tbody></table>\n<p>Score: set F1 for a set answer, else token F1 (best over the golds); a failed question scores 0.</p>\n");
    if let [a, b] = runs {
        let c = compare(a, b);
        if c.a_higher + c.b_higher + c.same == 0 {
            out.push_str("<p>The two runs share no question (by id): nothing to compare.</p>\n");
        } else {
            out.push_str(&format!(
                "<p>Question by question: {} higher on {}, {} higher on {}, the same on {}.</p>\n",
                esc(&a.label),
                c.a_higher,
                esc(&b.label),
                c.b_higher,
                c.same
            ));
        }
    }
    for plot in plots {
        // The SVG's own XML declaration does not belong inside HTML.
        let svg = plot
            .svg
            .trim_start_matches(|c| c != '<')
            .trim_start_matches("<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
            .trim();
        out.push_str(&format!(
            "<figure id=\"{}\"><figcaption>{}</figcaption>\n{svg}\n</figure>\n",
            plot.file.trim_end_matches(".svg"),
            esc(plot.title)
        ));
    }
    out.push_str("</body></html>\n");
    out
}
