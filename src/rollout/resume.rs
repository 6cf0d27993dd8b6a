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

/// A continued assistant message seeker cannot resume from without losing
/// some of it; the HTTP layer answers it with a 400 naming the message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unresumable {
    /// A call that no document block answers, with more of the client's
    /// text after it. Running the call would drop that text; keeping the
    /// text would leave the call unanswered.
    #[error(
        "the continued assistant message has a call at byte {at} ({call:?}) that no {documents} \
         block answers, and more text after it: end the message after the call for seeker to \
         run it, or splice the call's documents after it"
    )]
    Unanswered {
        /// Byte offset of the call's opening tag (its closing tag when it has none).
        at: usize,
        /// The call as the client wrote it, cut to 80 characters.
        call: String,
        /// The document-block opening tag that answers a call (`<information>`).
        documents: String,
    },
    /// A tool-calling policy's continued message holding a tool response
    /// inline: the policy reads tool responses as their own turns, so the
    /// rollout would cut the message there.
    #[error(
        "the continued assistant message holds a tool response ({documents} at byte {at}): a \
         tool-calling policy reads tool responses as their own turns — send the call in the \
         assistant message (its text or tool_calls), each response as a `tool` message after \
         it, and continue from there"
    )]
    InlineToolResponse {
        /// Byte offset of the response's opening tag.
        at: usize,
        /// The tool-response opening tag (`<tool_response>`).
        documents: String,
    },
}

/// Splits `text`, the client's continued assistant message, for `profile`.
///
/// The message is read left to right. A call whose closing tag is followed
/// (after whitespace) by the profile's document-block opening is answered:
/// it counts, and the scan goes on after the block's closing tag, so a tag
/// inside the documents is never taken for a call. The trusted prefix ends
/// at the first of: an answer opening, a call nothing answers, the end. A
/// message with no answered call before that point is all tail, as before.
///
/// # Errors
/// [`Unresumable::Unanswered`] when a call nothing answers is followed by
/// more text; [`Unresumable::InlineToolResponse`] when a tool-calling
/// profile's message holds a tool response (those are `tool` messages).
pub(super) fn split<'t>(profile: &Profile, text: &'t str) -> Result<Split<'t>, Unresumable> {
    let whole = Split {
        trusted: "",
        tail: text,
        calls: 0,
    };
    if profile.tools.is_some() {
        let documents = profile.documents_open.as_str();
        if let Some(at) = (!documents.is_empty())
            .then(|| text.find(documents))
            .flatten()
        {
            return Err(Unresumable::InlineToolResponse {
                at,
                documents: documents.to_string(),
            });
        }
        return Ok(whole);
    }
    let mut calls: Vec<(&str, &str)> = vec![(&profile.query_open, &profile.query_close)];
    if let Some(pages) = &profile.pages {
        calls.push((&pages.open, &pages.close));
    }
    calls.retain(|(_, close)| !close.is_empty());
    let documents = profile.documents_open.as_str();
    let documents_close = profile.documents_close.as_str();
    let answer = profile.answer_open.as_str();
    // Where the text since the last answered call (or the start) begins.
    let mut segment = 0;
    let mut at = 0;
    let mut count = 0;
    let cut = loop {
        // The earliest tag from `at`: a call's close, a document block, an answer.
        let closes = calls.iter().filter_map(|&(open, close)| {
            text[at..]
                .find(close)
                .map(|i| (at + i, Some((open, close))))
        });
        let blocks = [documents, answer]
            .into_iter()
            .filter(|tag| !tag.is_empty())
            .filter_map(|tag| text[at..].find(tag).map(|i| (at + i, None)));
        let Some((found, call)) = closes.chain(blocks).min_by_key(|(i, _)| *i) else {
            break text.len();
        };
        let Some((open, close)) = call else {
            if !answer.is_empty() && text[found..].starts_with(answer) {
                break found;
            }
            // The client's own document block, not after a call: kept as is.
            at = skip_block(text, found, documents, documents_close);
            continue;
        };
        let close_end = found + close.len();
        let opened = (!open.is_empty())
            .then(|| text[segment..found].rfind(open))
            .flatten()
            .map(|i| segment + i);
        let after = &text[close_end..];
        let rest = after.trim_start();
        if opened.is_some() && !documents.is_empty() && rest.starts_with(documents) {
            count += 1;
            at = skip_block(text, text.len() - rest.len(), documents, documents_close);
            segment = at;
            continue;
        }
        let call_at = opened.unwrap_or(found);
        if !rest.is_empty() {
            return Err(Unresumable::Unanswered {
                at: call_at,
                call: text[call_at..close_end].chars().take(80).collect(),
                documents: documents.to_string(),
            });
        }
        break call_at;
    };
    if count == 0 {
        return Ok(whole);
    }
    Ok(Split {
        trusted: &text[..cut],
        tail: &text[cut..],
        calls: count,
    })
}

/// The end of the document block whose opening tag starts at `from`: after
/// its closing tag, or the end of `text` when it is never closed.
fn skip_block(text: &str, from: usize, open: &str, close: &str) -> usize {
    let body = from + open.len();
    match (!close.is_empty())
        .then(|| text[body..].find(close))
        .flatten()
    {
        Some(i) => body + i + close.len(),
        None => text.len(),
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
                split(&p, text).unwrap(),
                Split {
                    trusted: "",
                    tail: text,
                    calls: 0
                }
            );
        }
    }

    /// IRCoT (no opening query tag): one sentence is searched before any
    /// token; more after its full stop is refused, articles included.
    #[test]
    fn an_ircot_message_resumes_as_one_sentence() {
        let p = shipped("ircot");
        for text in ["The husband of Ann Lee is Bo Tan.", "So the answer is: Bo"] {
            let s = split(&p, text).unwrap();
            assert_eq!((s.trusted, s.tail, s.calls), ("", text, 0));
        }
        for text in [
            "Ann Lee is here. Bo Tan is too.",
            "Ann Lee is here.\nArticle: \"Ann Lee\" The husband of Ann Lee is Bo Tan.\n",
        ] {
            assert!(
                matches!(split(&p, text), Err(Unresumable::Unanswered { at: 15, .. })),
                "{text}"
            );
        }
    }

    #[test]
    fn a_lone_trailing_call_is_the_tail_as_before() {
        let p = search_r1();
        let text = "<think>hm</think>\n<search> q1 </search>\n";
        assert_eq!(split(&p, text).unwrap().tail, text);
        assert_eq!(split(&p, text).unwrap().calls, 0);
    }

    #[test]
    fn answered_calls_are_trusted_and_a_trailing_call_is_the_tail() {
        let p = search_r1();
        let head = "<search> q1 </search>\n\n<information>Doc 1(Title: \"A\") a\n</information>\n\n<think>more</think>\n";
        let text = format!("{head}<search> q2 </search>");
        let s = split(&p, &text).unwrap();
        assert_eq!(s.trusted, head);
        assert_eq!(s.tail, "<search> q2 </search>");
        assert_eq!(s.calls, 1);
    }

    #[test]
    fn after_its_last_answered_call_the_message_is_trusted_up_to_an_open_answer() {
        let p = search_r1();
        let head = "<search> q1 </search>\n\n<information>x</information>\n\n";
        let s = split(&p, head).unwrap();
        assert_eq!((s.trusted, s.tail, s.calls), (head, "", 1));
        let text = format!("{head}<think>so</think>\n<answer> Par");
        let s = split(&p, &text).unwrap();
        assert_eq!(s.trusted, format!("{head}<think>so</think>\n"));
        assert_eq!(s.tail, "<answer> Par");
    }

    #[test]
    fn several_answered_calls_all_count() {
        let p = search_r1();
        let text = "<search> a </search><information>x</information><search> b </search><information>y</information><search> c </search>";
        let s = split(&p, text).unwrap();
        assert_eq!(s.calls, 2);
        assert_eq!(s.tail, "<search> c </search>");
    }

    #[test]
    fn tool_calling_profiles_are_not_split() {
        let p = shipped("tool-search");
        let text = "<tool_call>\n{}\n</tool_call>\nmore";
        assert_eq!(split(&p, text).unwrap().tail, text);
    }

    #[test]
    fn a_tool_response_inline_in_a_tool_calling_message_is_refused() {
        for name in ["tool-search", "recall", "tongyi-deepresearch"] {
            let p = shipped(name);
            let text = format!(
                "<tool_call>\n{{}}\n</tool_call>\n{}x\n</tool_response>\n<tool_call>\n{{}}\n</tool_call>",
                p.documents_open
            );
            let e = split(&p, &text).unwrap_err();
            let Unresumable::InlineToolResponse { at, documents } = &e else {
                panic!("{name}: {e}");
            };
            assert_eq!(documents, &p.documents_open, "{name}");
            assert!(text[*at..].starts_with(&p.documents_open), "{name}: {e}");
            assert!(e.to_string().contains("`tool` message"), "{e}");
        }
    }

    #[test]
    fn a_stray_closing_tag_after_an_answered_call_is_the_tail() {
        let p = search_r1();
        let head = "<search> q1 </search>\n\n<information>x</information>\n\nso ";
        let text = format!("{head}</search>");
        let s = split(&p, &text).unwrap();
        assert_eq!((s.trusted, s.tail, s.calls), (head, "</search>", 1));
    }

    #[test]
    fn tags_inside_the_documents_are_not_calls() {
        let p = search_r1();
        let head =
            "<search> q1 </search>\n\n<information>a <search> b </search> c</information>\n\n";
        let text = format!("{head}<search> q2 </search>");
        let s = split(&p, &text).unwrap();
        assert_eq!((s.trusted, s.calls), (head, 1));
        assert_eq!(s.tail, "<search> q2 </search>");
    }

    #[test]
    fn a_call_nothing_answers_with_text_after_it_is_refused() {
        let p = search_r1();
        for text in [
            "<search> q1 </search> I guess Paris.",
            "<search> q1 </search>\u{2039}|im_end|\u{203a}",
            "<search> q1 </search><information>x</information><search> q2 </search> more",
        ] {
            let e = split(&p, text).unwrap_err();
            let Unresumable::Unanswered { at, documents, .. } = &e else {
                panic!("{text}: {e}");
            };
            assert_eq!(documents, "<information>");
            assert!(text[*at..].starts_with("<search>"), "{text}: {e}");
        }
    }

    #[test]
    fn an_answer_ends_the_trusted_prefix_with_or_without_an_earlier_call() {
        let p = search_r1();
        let text = "<answer> Paris </answer><search> q </search>";
        assert_eq!(split(&p, text).unwrap().tail, text);
        let head = "<search> a </search><information>x</information>";
        let text = format!("{head}<answer> Paris </answer><search> q </search>");
        let s = split(&p, &text).unwrap();
        assert_eq!(s.trusted, head);
        assert_eq!(s.tail, "<answer> Paris </answer><search> q </search>");
    }

    #[test]
    fn page_reads_and_their_chunks_are_answered_calls() {
        let p = shipped("asearcher");
        let head = "<access> https://a.example </access>\n\n<information>\n>>>> Page 1 >>>>\n\nx </search>\n</information>\n<think>\nok</think>\n\n<information>\n>>>> Page 2 >>>>\n\ny\n</information>\n<think>\n";
        let text = format!("{head}<search> q </search>");
        let s = split(&p, &text).unwrap();
        assert_eq!((s.trusted, s.calls), (head, 1));
    }

    #[test]
    fn the_document_block_closes_at_the_tag_after_docs() {
        for (name, close) in [
            ("search-r1", "</information>"),
            ("r1-searcher", "<|end_of_documents|>"),
            ("research", "</result>"),
            ("r-search", "</observation>"),
        ] {
            assert_eq!(shipped(name).documents_close, close, "{name}");
        }
    }
}
