//! QA metrics as the search-policy papers compute them (Search-R1, RAG-R1 and
//! R1-Searcher evaluation scripts, which share SQuAD's normalisation): exact match (EM), cover-EM
//! and token F1, each the maximum over the gold answers.
//!
//! Normalisation: Unicode NFKC (full-width letters and digits become ASCII,
//! ligatures split), lower case, punctuation removed (ASCII punctuation and the
//! Unicode quotes, dashes and ellipsis answers carry), the articles `a`, `an`,
//! `the` removed, whitespace collapsed.
//!
//! Guards: an empty prediction never matches, and a gold answer that normalises
//! to nothing (e.g. "The", "a") matches nothing, so an empty prediction can
//! never score by matching an empty gold.
//!
//! Set answers (PhantomWiki's, whose golds are every member of the answer)
//! are scored by set precision, recall and F1 instead ([`set_scores`]), with
//! PhantomWiki's own, plainer reading of an answer: split on commas,
//! stripped, lower-cased — after one step of seeker's own: an answer written
//! as a sentence is read from its last clause ([`answer_clause`]).

use std::collections::HashMap;

use unicode_normalization::UnicodeNormalization;

/// Characters removed as punctuation besides ASCII punctuation.
const UNICODE_PUNCTUATION: &[char] = &[
    '‘', '’', '‚', '‛', '“', '”', '„', '‟', '´', '`', '–', '—', '―', '…', '«', '»', '‹', '›', '¿',
    '¡', '·', '•', '、', '。', '，', '：', '；', '！', '？', '（', '）', '「', '」', '『', '』',
    '【', '】',
];

/// The normalised form of `text` (see the module documentation).
pub fn normalize(text: &str) -> String {
    let folded: String = text
        .nfkc()
        .flat_map(char::to_lowercase)
        .filter(|c| !c.is_ascii_punctuation() && !UNICODE_PUNCTUATION.contains(c))
        .collect();
    folded
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn tokens(normalized: &str) -> Vec<&str> {
    normalized.split_whitespace().collect()
}

/// Exact match: the normalised prediction equals a normalised gold (1.0 or 0.0).
pub fn exact_match(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    if p.is_empty() {
        return 0.0;
    }
    let hit = golds.iter().any(|g| {
        let g = normalize(g);
        !g.is_empty() && g == p
    });
    if hit {
        1.0
    } else {
        0.0
    }
}

/// Cover-EM (R1-Searcher): every token of a normalised gold occurs in the
/// normalised prediction (1.0 or 0.0).
pub fn cover_exact_match(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    let p_tokens = tokens(&p);
    if p_tokens.is_empty() {
        return 0.0;
    }
    let hit = golds.iter().any(|g| {
        let g = normalize(g);
        let g_tokens = tokens(&g);
        !g_tokens.is_empty() && g_tokens.iter().all(|t| p_tokens.contains(t))
    });
    if hit {
        1.0
    } else {
        0.0
    }
}

/// Token F1 between the normalised prediction and each gold, the best one.
pub fn f1(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    let p_tokens = tokens(&p);
    golds
        .iter()
        .map(|g| {
            let g = normalize(g);
            let g_tokens = tokens(&g);
            if p_tokens.is_empty() || g_tokens.is_empty() {
                return 0.0;
            }
            let mut counts: HashMap<&str, i64> = HashMap::new();
            for t in &g_tokens {
                *counts.entry(t).or_default() += 1;
            }
            let mut common = 0i64;
            for t in &p_tokens {
                if let Some(c) = counts.get_mut(t) {
                    if *c > 0 {
                        *c -= 1;
                        common += 1;
                    }
                }
            }
            if common == 0 {
                return 0.0;
            }
            let precision = common as f64 / p_tokens.len() as f64;
            let recall = common as f64 / g_tokens.len() as f64;
            2.0 * precision * recall / (precision + recall)
        })
        .fold(0.0, f64::max)
}

/// True when a normalised gold occurs, on word boundaries, in the normalised
/// `text` (answer recall of retrieved documents).
pub fn contains_answer(text: &str, golds: &[String]) -> bool {
    let t = format!(" {} ", normalize(text));
    golds.iter().any(|g| {
        let g = normalize(g);
        !g.is_empty() && t.contains(&format!(" {g} "))
    })
}

/// The separator PhantomWiki's evaluation splits answers on
/// (`phantom_eval/constants.py`: `answer_sep = ","`).
pub const SET_SEPARATOR: char = ',';

/// Set precision, recall and F1 of one prediction against a set answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SetScores {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
}

/// The members of an answer as PhantomWiki's evaluation reads them
/// (`phantom_eval/utils.py::normalize_pred`): split on [`SET_SEPARATOR`],
/// each part stripped of whitespace and lower-cased, duplicates dropped. No
/// other normalisation: "Ann Lee" and "ann lee." are different members
/// (give [`answer_clause`] the text first to read a sentence).
pub fn answer_set(text: &str) -> std::collections::BTreeSet<String> {
    text.split(SET_SEPARATOR)
        .map(|part| part.trim().to_lowercase())
        .collect()
}

/// The part of an answer that names its members: for an answer written as a
/// sentence, what follows its last ` is ` or ` are ` (ASCII case ignored),
/// without the full stop ("… the brother of the parent of Barabara Tudor is
/// Bryce Tudor." → "Bryce Tudor"; "… are A, B." → "A, B"); otherwise the
/// answer without a trailing full stop. PhantomWiki's own agents are prompted
/// to answer with the names alone and their answers are split as they stand;
/// seeker's policies keep their own prompts, and an instruct model answering
/// through a tool-calling policy writes sentences, so this step reads them.
/// No PhantomWiki name, date, occupation or hobby contains " is " or " are ".
pub fn answer_clause(text: &str) -> &str {
    let text = text.trim();
    let text = text.strip_suffix('.').unwrap_or(text).trim_end();
    // ASCII lower-casing keeps every byte offset of `text`.
    let lower = text.to_ascii_lowercase();
    let after = [" is ", " are "]
        .iter()
        .filter_map(|copula| lower.rfind(copula).map(|at| at + copula.len()))
        .max();
    match after {
        Some(at) => text[at..].trim(),
        None => text,
    }
}

/// Set precision, recall and F1 as PhantomWiki scores them
/// (`phantom_eval/score.py`, arXiv 2502.20377): the prediction's
/// [`answer_clause`] and the golds (joined by the separator first, as its
/// `get_scores_for_predictions` does) are read as sets by [`answer_set`];
/// precision is the share of predicted members that are gold, recall the
/// share of gold members predicted, F1 their harmonic mean (0 when both are
/// 0). An empty prediction is the set of one empty member, so it scores 0.
pub fn set_scores(prediction: &str, golds: &[String]) -> SetScores {
    let predicted = answer_set(answer_clause(prediction));
    let gold = answer_set(&golds.join(&SET_SEPARATOR.to_string()));
    let common = predicted.intersection(&gold).count() as f64;
    let precision = common / predicted.len() as f64;
    let recall = common / gold.len() as f64;
    let f1 = if precision + recall == 0.0 {
        0.0
    } else {
        2.0 * precision * recall / (precision + recall)
    };
    SetScores {
        precision,
        recall,
        f1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golds(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalisation_follows_squad_with_unicode_forms() {
        assert_eq!(normalize("The  Eiffel-Tower!"), "eiffeltower");
        assert_eq!(normalize("Paris."), "paris");
        assert_eq!(normalize("Ｐａｒｉｓ．"), "paris");
        assert_eq!(normalize("“Leonardo da Vinci”"), "leonardo da vinci");
        assert_eq!(normalize("an apple a day"), "apple day");
    }

    #[test]
    fn trailing_punctuation_and_full_width_forms_match() {
        assert_eq!(exact_match("Paris.", &golds(&["Paris"])), 1.0);
        assert_eq!(exact_match("Ｐａｒｉｓ", &golds(&["paris"])), 1.0);
        assert_eq!(exact_match("the Paris", &golds(&["Paris"])), 1.0);
        // Accents are kept: NFKC composes, it does not strip.
        assert_eq!(exact_match("Jose", &golds(&["José"])), 0.0);
        assert_eq!(exact_match("Jose\u{301}", &golds(&["José"])), 1.0);
    }

    #[test]
    fn golds_that_normalise_to_nothing_never_match() {
        for g in ["A", "The", "an", "...", ""] {
            assert_eq!(exact_match("", &golds(&[g])), 0.0, "{g:?}");
            assert_eq!(exact_match("the", &golds(&[g])), 0.0, "{g:?}");
            assert_eq!(cover_exact_match("", &golds(&[g])), 0.0, "{g:?}");
            assert_eq!(f1("", &golds(&[g])), 0.0, "{g:?}");
        }
        // An empty prediction never matches a real gold either.
        assert_eq!(exact_match("   ", &golds(&["Paris"])), 0.0);
        assert_eq!(f1("", &golds(&["Paris"])), 0.0);
    }

    #[test]
    fn the_best_of_several_golds_counts() {
        let g = golds(&["Leonardo da Vinci", "Leonardo", "da Vinci"]);
        assert_eq!(exact_match("Leonardo", &g), 1.0);
        assert_eq!(exact_match("Michelangelo", &g), 0.0);
        // F1 against "da Vinci": precision 2/3, recall 1.
        assert!((f1("Leonardo's da Vinci", &g) - 0.8).abs() < 1e-9);
        assert!((f1("painted by Leonardo da Vinci", &g) - 0.75).abs() < 1e-9);
    }

    #[test]
    fn cover_em_needs_every_gold_token() {
        let g = golds(&["Leonardo da Vinci"]);
        assert_eq!(
            cover_exact_match("It was painted by Leonardo da Vinci in 1503.", &g),
            1.0
        );
        assert_eq!(cover_exact_match("It was Leonardo.", &g), 0.0);
    }

    #[test]
    fn answer_recall_matches_whole_words_only() {
        let g = golds(&["Paris"]);
        assert!(contains_answer("Paris is the capital of France.", &g));
        assert!(!contains_answer("Parisian cafés", &g));
        assert!(!contains_answer("anything", &golds(&["The"])));
    }

    #[test]
    fn set_scores_split_on_commas_as_phantomwiki_does() {
        let g = golds(&["Barabara Beltran", "Vicki Hackworth"]);
        let whole = set_scores(" vicki hackworth ,Barabara Beltran", &g);
        assert_eq!((whole.precision, whole.recall, whole.f1), (1.0, 1.0, 1.0));
        // One of two right and nothing wrong: precision 1, recall 1/2.
        let half = set_scores("Vicki Hackworth", &g);
        assert_eq!((half.precision, half.recall), (1.0, 0.5));
        assert!((half.f1 - 2.0 / 3.0).abs() < 1e-12);
        // One right, one wrong, duplicates counted once: 1/2 and 1/2.
        let mixed = set_scores("Vicki Hackworth, Ann Lee, Vicki Hackworth", &g);
        assert_eq!((mixed.precision, mixed.recall, mixed.f1), (0.5, 0.5, 0.5));
        // Only commas separate: "and" makes another member.
        assert_eq!(
            set_scores("Barabara Beltran and Vicki Hackworth", &g).f1,
            0.0
        );
        assert_eq!(set_scores("Vicki Hackworth.", &g), half);
        assert_eq!(set_scores("", &g).f1, 0.0);
        // A number answer ("How many") is a one-member set.
        assert_eq!(set_scores("3", &golds(&["3"])).f1, 1.0);
    }

    #[test]
    fn a_sentence_answer_is_read_from_its_last_clause() {
        // As the tool-calling policies answer PhantomWiki questions.
        let cases = [
            (
                "According to the search results, the brother of the parent of Barabara \
                 Tudor is Bryce Tudor.",
                "Bryce Tudor",
            ),
            (
                "the friend of the person whose date of birth is 0976-08-12 is Terence Landeros.",
                "Terence Landeros",
            ),
            (
                "The friends of the child of Lindsey Hartwell ARE Janis Kling, Jake Nunes.",
                "Janis Kling, Jake Nunes",
            ),
            (" Vicki Hackworth, Ann Lee. ", "Vicki Hackworth, Ann Lee"),
            ("0959-03-22", "0959-03-22"),
            // "is" inside a word is no copula.
            ("Isabel Tristan, Chris Ison", "Isabel Tristan, Chris Ison"),
            ("", ""),
        ];
        for (answer, clause) in cases {
            assert_eq!(answer_clause(answer), clause, "{answer}");
        }
        let g = golds(&["Janis Kling", "Jake Nunes", "Nora Doolittle"]);
        let s = set_scores(
            "The friends of Zachary Hartwell are Janis Kling, Jake Nunes.",
            &g,
        );
        assert_eq!((s.precision, s.recall), (1.0, 2.0 / 3.0));
    }
}
