//! Resuming a rollout from a client's transcript (`continue_final_message`).
//!
//! An eval harness or an RL trainer that resumes a rollout sends the
//! assistant message it has so far: earlier search calls, the documents
//! spliced after them, more reasoning, and perhaps a new call at the end.
//! Generated text is scanned with suspicion (the round ends at the first
//! closing tag, and a model-written document block is an invalid action),
//! but the client's own message is a prefix it vouches for. So the message
//! is split in two:
//! - the **trusted prefix**: everything up to the last call the message
//!   answers itself, with the documents and reasoning after it. It enters the
//!   transcript as is, and its calls count against the profile's
//!   `max_searches`;
//! - the **tail**, scanned as today: a trailing call with nothing after it
//!   (the one call seeker runs before generating), or an answer the message
//!   opened after its last call.
//!
//! A message without a closed call is all tail, as before. Tool-calling
//! profiles are left out: their tool responses are separate chat turns
//! (`tool` messages), not text inside the assistant message.

use serde::Serialize;

use crate::profile::Profile;

/// What a rollout resumed from: the part of the client's continued assistant
/// message taken as a trusted prefix (`seeker.resumed` in the response).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Resumed {
    /// Bytes (UTF-8, after control tokens were defused) of the client's
    /// message that entered the transcript as the client wrote them.
    pub bytes: usize,
    /// Search calls and page actions in that prefix: each counts against the
    /// profile's `max_searches` as if the rollout had made it.
    pub calls: usize,
}

/// The continued message cut into its trusted prefix and the tail to scan.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Split<'t> {
    pub trusted: &'t str,
    pub tail: &'t str,
    pub calls: usize,
}

/// Splits `text`, the client's continued assistant message, for `profile`
/// (see the module docs). `trusted` is empty, and `tail` the whole message,
/// when the message holds no call it answers itself.
pub(super) fn split<'t>(profile: &Profile, text: &'t str) -> Split<'t> {
    let whole = Split {
        trusted: "",
        tail: text,
        calls: 0,
    };
    if profile.tools.is_some() {
        return whole;
    }
    let mut calls: Vec<(&str, &str)> = vec![(&profile.query_open, &profile.query_close)];
    if let Some(pages) = &profile.pages {
        calls.push((&pages.open, &pages.close));
    }
    calls.retain(|(_, close)| !close.is_empty());
    // The last closing tag of any call, and the opening tag of its kind.
    let Some((close_at, close_end, open)) = calls
        .iter()
        .filter_map(|(open, close)| text.rfind(close).map(|at| (at, at + close.len(), *open)))
        .max_by_key(|(at, _, _)| *at)
    else {
        return whole;
    };
    let cut = if text[close_end..].trim().is_empty() {
        // Unanswered: the tail is the call, from its opening tag.
        (!open.is_empty())
            .then(|| text[..close_at].rfind(open))
            .flatten()
            .unwrap_or(close_at)
    } else {
        // Answered: the tail is an answer opened after it, if any.
        let answer = &profile.answer_open;
        (!answer.is_empty())
            .then(|| text[close_end..].rfind(answer.as_str()))
            .flatten()
            .map_or(text.len(), |at| close_end + at)
    };
    let trusted = &text[..cut];
    let count = calls
        .iter()
        .map(|(_, close)| trusted.matches(close).count())
        .sum();
    if count == 0 {
        return whole;
    }
    Split {
        trusted,
        tail: &text[cut..],
        calls: count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::shipped;

    fn search_r1() -> Profile {
        shipped("search-r1")
    }

    #[test]
    fn a_message_without_a_closed_call_is_all_tail() {
        let p = search_r1();
        for text in ["", "Let me think.", "<search> open", "<answer> Par"] {
            assert_eq!(
                split(&p, text),
                Split {
                    trusted: "",
                    tail: text,
                    calls: 0
                }
            );
        }
    }

    #[test]
    fn a_lone_trailing_call_is_the_tail_as_before() {
        let p = search_r1();
        let text = "<think>hm</think>\n<search> q1 </search>\n";
        assert_eq!(split(&p, text).tail, text);
        assert_eq!(split(&p, text).calls, 0);
    }

    #[test]
    fn answered_calls_are_trusted_and_a_trailing_call_is_the_tail() {
        let p = search_r1();
        let head = "<search> q1 </search>\n\n<information>Doc 1(Title: \"A\") a\n</information>\n\n<think>more</think>\n";
        let text = format!("{head}<search> q2 </search>");
        let s = split(&p, &text);
        assert_eq!(s.trusted, head);
        assert_eq!(s.tail, "<search> q2 </search>");
        assert_eq!(s.calls, 1);
    }

    #[test]
    fn after_its_last_answered_call_the_message_is_trusted_up_to_an_open_answer() {
        let p = search_r1();
        let head = "<search> q1 </search>\n\n<information>x</information>\n\n";
        let s = split(&p, head);
        assert_eq!((s.trusted, s.tail, s.calls), (head, "", 1));
        let text = format!("{head}<think>so</think>\n<answer> Par");
        let s = split(&p, &text);
        assert_eq!(s.trusted, format!("{head}<think>so</think>\n"));
        assert_eq!(s.tail, "<answer> Par");
    }

    #[test]
    fn several_answered_calls_all_count() {
        let p = search_r1();
        let text = "<search> a </search><information>x</information><search> b </search><information>y</information><search> c </search>";
        let s = split(&p, text);
        assert_eq!(s.calls, 2);
        assert_eq!(s.tail, "<search> c </search>");
    }

    #[test]
    fn tool_calling_profiles_are_not_split() {
        let p = shipped("tool-search");
        let text = "<tool_call>\n{}\n</tool_call>\nmore";
        assert_eq!(split(&p, text).tail, text);
    }
}
