//! Golden splices: every profile renders the cases of tests/fixtures/splices/cases.json
//! byte for byte as the policy's reference code does (the expected files are written
//! by tests/fixtures/splices/make_fixtures.py with python3).

use seeker::profile::QueryOutcome;
use seeker::search::Document;
use serde::Deserialize;

use crate::common::{profile, root};

#[derive(Deserialize)]
struct Case {
    name: String,
    profiles: Vec<String>,
    results: Vec<CaseResult>,
}

#[derive(Deserialize)]
struct CaseResult {
    query: String,
    documents: Vec<CaseDoc>,
}

#[derive(Deserialize)]
struct CaseDoc {
    id: String,
    title: String,
    text: String,
}

#[test]
fn every_profile_splices_byte_for_byte_like_its_reference_code() {
    let dir = root().join("tests/fixtures/splices");
    let cases: Vec<Case> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let mut checked = 0;
    for case in &cases {
        let docs: Vec<Vec<Document>> = case
            .results
            .iter()
            .map(|r| {
                r.documents
                    .iter()
                    .map(|d| Document {
                        id: d.id.clone(),
                        title: d.title.clone(),
                        text: d.text.clone(),
                        url: None,
                        score: 1.0,
                        backend: "static".into(),
                    })
                    .collect()
            })
            .collect();
        let results: Vec<(&str, QueryOutcome<'_>)> = case
            .results
            .iter()
            .zip(&docs)
            .map(|(r, d)| (r.query.as_str(), QueryOutcome::Documents(d)))
            .collect();
        for name in &case.profiles {
            let expected =
                std::fs::read_to_string(dir.join(format!("{name}.{}.txt", case.name))).unwrap();
            let got = profile(name).render_splice(&results);
            assert_eq!(got, expected, "{name} / {}", case.name);
            checked += 1;
        }
    }
    assert_eq!(checked, 25);
}

#[test]
fn search_r1_splice_equals_the_protocols_example() {
    // Search-R1's own example: `Doc 1(Title: "Evan Morris") Evan L. Morris (January 26, ...`
    let doc = Document {
        id: "1".into(),
        title: "Evan Morris".into(),
        text: "Evan L. Morris (January 26, 1977 – July 9, 2015) was a lobbyist.".into(),
        url: None,
        score: 1.0,
        backend: "static".into(),
    };
    let got = profile("search-r1").render_splice(&[(
        "Evan Morris",
        QueryOutcome::Documents(std::slice::from_ref(&doc)),
    )]);
    assert_eq!(
        got,
        "\n\n<information>Doc 1(Title: \"Evan Morris\") Evan L. Morris (January 26, 1977 – July \
         9, 2015) was a lobbyist.</information>\n\n"
    );
}

#[test]
fn a_failed_query_is_spliced_as_a_failure_never_as_an_empty_block() {
    for name in ["search-r1", "rag-r1-sq", "r1-searcher"] {
        let got = profile(name).render_splice(&[("q", QueryOutcome::Failed("timed out"))]);
        assert!(got.contains("search failed: timed out"), "{name}: {got:?}");
    }
    let got = profile("rag-r1-mq").render_splice(&[
        ("a", QueryOutcome::Failed("timed out")),
        ("b", QueryOutcome::Documents(&[])),
    ]);
    assert!(
        got.contains("\"search failed: timed out\",\n    \"\""),
        "{got}"
    );
}
