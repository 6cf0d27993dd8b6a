//! What a round's end means, decided without an engine, a search backend or a
//! channel: [`decide`] reads the profile, what the rollout has done so far and
//! how the round ended, and returns a [`Decision`] that the async driver
//! (`round.rs`) carries out. Every protocol mechanism's branch — a search
//! call, a call with no query, the round cap, an answer, an invalid action, a
//! tool-call turn, a call of the client's functions, a page action, a pause
//! while reading a page — is chosen here, so the unit tests below drive each
//! one with hand-made inputs.

use std::collections::HashSet;

use super::{ClientTools, FinishReason, RoundEnded, RoundOutcome, RoundRecord, ToolChoice};
use crate::engine::EngineFinish;
use crate::profile::{CallPlan, CleanedQueries, Profile};
use crate::scanner::RoundEnd;
use crate::toolcall::{parse_turn, Invocation, ToolCall};

/// What the rollout has done so far, as far as [`decide`] needs it.
pub(super) struct RoundState<'a> {
    /// Calls so far (search calls, page actions, tool-call turns and invalid
    /// actions): what the profile's `max_searches` caps.
    pub calls: usize,
    /// Answer text was already streamed: a search call after it is no call.
    pub answer_started: bool,
    /// A stop string of the request ended the answer.
    pub stopped: bool,
    /// The client's own functions and how it lets them be called.
    pub client: &'a ClientTools,
    /// The rounds so far: their queries are the ones already searched, for
    /// profiles that answer a repeated query (`tools.repeated`).
    pub rounds: &'a [RoundRecord],
}

/// What to do with a round that ended: the text that stays in the transcript,
/// then the step.
#[derive(Debug, PartialEq)]
pub(super) struct Decision {
    /// The round's text as it enters the transcript: as generated, through
    /// its closing tag with the body trimmed (`strip_round`), or a tool-call
    /// turn trimmed (Tongyi DeepResearch's `content.strip()`).
    pub keep: String,
    pub step: Step,
}

/// The step after a round, for the driver to carry out.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// The policy paused while reading a page: record [`RoundOutcome::Read`]
    /// and splice the page's next chunk, if one waits.
    ReadOn,
    /// The rollout ends with `reason`; the round is recorded as `outcome`.
    /// `fallback`: whether the text since the last splice may still become
    /// the answer (not for a tool-call turn, whose text is a call).
    Finish {
        outcome: RoundOutcome,
        reason: FinishReason,
        fallback: bool,
    },
    /// The profile's answer function was called: its argument is the
    /// answer, and the rollout stops.
    AnswerCall(String),
    /// Calls of the client's functions end the turn (finish reason
    /// `tool_calls`): all of them when it allows parallel calls, else the
    /// first. Calls of seeker's own functions in the same turn do not run.
    ClientCalls(Vec<Invocation>),
    /// A turn of calls seeker runs, each with its plan (repeated queries
    /// already answered where the profile says so); one call against the cap.
    Tools {
        calls: Vec<ToolCall>,
        plans: Vec<CallPlan>,
    },
    /// A search call with these queries; one call against the cap.
    Search(CleanedQueries),
    /// Splice the profile's `text` for a call it cannot run (a search call
    /// with no usable query, an invalid action); one call against the cap.
    /// `cap_stops`: whether reaching the cap with this call ends the rollout
    /// (`on_round_cap = "stop"`).
    Reply {
        outcome: RoundOutcome,
        text: String,
        cap_stops: bool,
    },
    /// Open this page (a URL or a corpus document) and splice its first
    /// chunk; one call against the cap.
    OpenPage(String),
    /// A page action that names no page: splice the profile's failed-page
    /// text; one call against the cap.
    NoPage,
}

/// What the end of `round`, whose text the scanner kept as `kept` (through
/// its closing tag), means for `profile`'s rollout in `state`.
///
/// The order of the checks is the protocol's: a pause while reading wins;
/// then a stop string that ended the answer; then, for a tool-calling policy
/// whose turn ended before any answer, its calls (the answer function, the
/// client's functions, seeker's own); then the closing tag: a search call or
/// page action below the cap, the cap, an answer, an invalid action; and
/// last the engine's own stop (end of sequence, or the token budget).
pub(super) fn decide(
    profile: &Profile,
    state: &RoundState<'_>,
    round: &RoundEnded,
    kept: &str,
) -> Decision {
    let text = |step| Decision {
        keep: kept.to_string(),
        step,
    };
    let finish = |outcome, reason| Step::Finish {
        outcome,
        reason,
        fallback: true,
    };
    if round.end == Some(RoundEnd::Pause) {
        return text(Step::ReadOn);
    }
    if state.stopped {
        return text(finish(RoundOutcome::Answer, FinishReason::Stop));
    }
    let capped = state.calls >= profile.max_searches;
    // A tool-calling policy's turn ended (end of sequence, or it started
    // writing the tool response itself): its calls, if any, are the action.
    let turn_ended = match &round.end {
        None => round.engine_finish != Some(EngineFinish::Length),
        Some(RoundEnd::DocumentsOpened) => true,
        Some(_) => false,
    };
    if profile.tools.is_some() && turn_ended && !state.answer_started {
        let mut calls = turn_calls(profile, kept);
        // `tool_choice: "none"`: the client's functions were not offered; a
        // call of one the model writes anyway is text, not a call.
        let client = state.client;
        if client.choice == ToolChoice::None {
            calls.retain(|c| !matches!(&c.parsed, Ok(call) if client.has(&call.name)));
        }
        if let Some(answer) = profile.answer_of(&calls) {
            return text(Step::AnswerCall(answer));
        }
        let for_client: Vec<Invocation> = calls
            .iter()
            .filter_map(|c| c.parsed.as_ref().ok())
            .filter(|call| client.has(&call.name))
            .take(if client.parallel { usize::MAX } else { 1 })
            .cloned()
            .collect();
        if !for_client.is_empty() {
            return text(Step::ClientCalls(for_client));
        }
        if !calls.is_empty() {
            let keep = if profile.strip_round {
                kept.trim()
            } else {
                kept
            };
            let step = if capped {
                // The round cap: the final round's calls are not run, and a
                // call is no answer.
                Step::Finish {
                    outcome: RoundOutcome::Search,
                    reason: FinishReason::Length,
                    fallback: false,
                }
            } else {
                let plans = calls
                    .iter()
                    .map(|c| without_repeats(profile, state.rounds, profile.plan_call(c)))
                    .collect();
                Step::Tools { calls, plans }
            };
            return Decision {
                keep: keep.to_string(),
                step,
            };
        }
    }
    match &round.end {
        Some(RoundEnd::Query(raw)) if !state.answer_started => {
            let keep = profile.round_text(kept, &profile.query_close);
            if capped {
                // The round cap: this final round's search call is not run.
                let step = finish(RoundOutcome::Search, FinishReason::Length);
                return Decision { keep, step };
            }
            let cleaned = profile.clean_queries(raw);
            let step = if !cleaned.queries.is_empty() {
                Step::Search(cleaned)
            } else if profile.no_query.is_empty() {
                finish(RoundOutcome::NoQuery, FinishReason::Stop)
            } else {
                Step::Reply {
                    outcome: RoundOutcome::NoQuery,
                    text: profile.no_query.clone(),
                    cap_stops: true,
                }
            };
            Decision { keep, step }
        }
        Some(RoundEnd::Page(raw)) if !state.answer_started => {
            let close = profile.pages.as_ref().map_or("", |p| p.close.as_str());
            let keep = profile.round_text(kept, close);
            let target = raw.trim();
            let step = if capped {
                // The round cap: this final round's page action is not run.
                finish(RoundOutcome::Page, FinishReason::Length)
            } else if target.is_empty() {
                Step::NoPage
            } else {
                Step::OpenPage(target.to_string())
            };
            Decision { keep, step }
        }
        // An answer, or a call after answer text was already streamed: the
        // answer stands.
        Some(RoundEnd::Answer(_) | RoundEnd::Query(_) | RoundEnd::Page(_)) => {
            text(finish(RoundOutcome::Answer, FinishReason::Stop))
        }
        // A closing tag the profile does not act on, or the document block
        // the policy started writing itself: the profile's invalid-action
        // text, which counts as a call.
        Some(RoundEnd::Unmatched(_) | RoundEnd::DocumentsOpened) => {
            if profile.invalid_action.is_empty() || state.answer_started || capped {
                text(finish(RoundOutcome::InvalidAction, FinishReason::Stop))
            } else {
                text(Step::Reply {
                    outcome: RoundOutcome::InvalidAction,
                    text: profile.invalid_action.clone(),
                    cap_stops: false,
                })
            }
        }
        // Handled first, above.
        Some(RoundEnd::Pause) => text(Step::ReadOn),
        None => match round.engine_finish {
            Some(EngineFinish::Length) => text(finish(RoundOutcome::Length, FinishReason::Length)),
            _ => text(finish(RoundOutcome::Eos, FinishReason::Stop)),
        },
    }
}

/// The calls in a tool-calling policy's finished turn `kept`, at most
/// `tools.calls_per_turn` of them when the profile caps them.
fn turn_calls(profile: &Profile, kept: &str) -> Vec<ToolCall> {
    let mut calls = parse_turn(kept, &profile.query_open, &profile.query_close);
    if let Some(tools) = profile.tools.as_ref().filter(|t| t.calls_per_turn > 0) {
        calls.truncate(tools.calls_per_turn);
    }
    calls
}

/// `plan` without the queries of `rounds`, when the profile answers repeated
/// queries (`tools.repeated`): a search call left with none gets that reply
/// instead. Queries compare trimmed and lower-cased.
fn without_repeats(profile: &Profile, rounds: &[RoundRecord], plan: CallPlan) -> CallPlan {
    let repeated = profile.tools.as_ref().map_or("", |t| t.repeated.as_str());
    let CallPlan::Search(mut cleaned) = plan else {
        return plan;
    };
    if repeated.is_empty() {
        return CallPlan::Search(cleaned);
    }
    let key = |q: &str| q.trim().to_lowercase();
    let before: HashSet<String> = rounds
        .iter()
        .filter(|r| r.round > 0)
        .flat_map(|r| r.queries.iter().map(|q| key(q)))
        .collect();
    let (new, old): (Vec<String>, Vec<String>) = cleaned
        .queries
        .into_iter()
        .partition(|q| !before.contains(&key(q)));
    if new.is_empty() {
        return CallPlan::Reply {
            text: repeated.to_string(),
            reason: format!("already searched: {old:?}"),
        };
    }
    if !old.is_empty() {
        cleaned
            .notes
            .push(format!("dropped queries searched before: {old:?}"));
    }
    cleaned.queries = new;
    CallPlan::Search(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::shipped;
    use serde_json::json;

    /// A rollout's state by hand: no calls, no answer, no client functions.
    #[derive(Default)]
    struct Given {
        calls: usize,
        answer_started: bool,
        stopped: bool,
        client: ClientTools,
        rounds: Vec<RoundRecord>,
    }

    impl Given {
        fn calls(calls: usize) -> Self {
            Self {
                calls,
                ..Self::default()
            }
        }

        /// The decision for a round that ended at `end` (`None`: the engine
        /// stopped, with `finish`) after the text `kept`.
        fn ends(&self, profile: &str, end: Option<RoundEnd>, kept: &str) -> Decision {
            let finish = end.is_none().then_some(EngineFinish::Stop);
            self.ends_with(profile, end, finish, kept)
        }

        fn ends_with(
            &self,
            profile: &str,
            end: Option<RoundEnd>,
            engine_finish: Option<EngineFinish>,
            kept: &str,
        ) -> Decision {
            let state = RoundState {
                calls: self.calls,
                answer_started: self.answer_started,
                stopped: self.stopped,
                client: &self.client,
                rounds: &self.rounds,
            };
            let round = RoundEnded {
                number: 1,
                end,
                engine_finish,
                tokens: 9,
            };
            decide(&shipped(profile), &state, &round, kept)
        }
    }

    fn query(raw: &str) -> Option<RoundEnd> {
        Some(RoundEnd::Query(raw.to_string()))
    }

    fn finish(outcome: RoundOutcome, reason: FinishReason) -> Step {
        Step::Finish {
            outcome,
            reason,
            fallback: true,
        }
    }

    fn searched(queries: &[&str]) -> Step {
        Step::Search(CleanedQueries {
            queries: queries.iter().map(|q| q.to_string()).collect(),
            notes: Vec::new(),
        })
    }

    /// `<tool_call>` blocks as Qwen writes them, one per call.
    fn turn(calls: &[serde_json::Value]) -> String {
        calls
            .iter()
            .map(|c| format!("<tool_call>\n{c}\n</tool_call>"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn call(name: &str, arguments: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "arguments": arguments})
    }

    fn searched_round(queries: &[&str]) -> RoundRecord {
        RoundRecord {
            round: 1,
            outcome: RoundOutcome::Search,
            queries: queries.iter().map(|q| q.to_string()).collect(),
            notes: Vec::new(),
            results: Vec::new(),
            pages: Vec::new(),
            tokens_generated: 9,
            prompt_tokens: None,
            prompt_tokens_cached: None,
        }
    }

    // Text tags (Search-R1 and the seeds that share its shape).

    #[test]
    fn a_closed_search_call_below_the_cap_is_searched_and_kept_as_written() {
        let kept = "I need the capital. <search> capital of France </search>";
        let d = Given::calls(3).ends("search-r1", query(" capital of France "), kept);
        assert_eq!(d.keep, kept);
        assert_eq!(d.step, searched(&["capital of France"]));
    }

    #[test]
    fn the_call_at_the_cap_is_kept_but_not_run() {
        let kept = "<search> Paris </search>";
        let d = Given::calls(4).ends("search-r1", query(" Paris "), kept);
        assert_eq!(d.keep, kept);
        assert_eq!(d.step, finish(RoundOutcome::Search, FinishReason::Length));
    }

    #[test]
    fn a_call_with_no_query_gets_the_profiles_text_or_ends_without_one() {
        let d = Given::default().ends("search-r1", query("   "), "<search>   </search>");
        let Step::Reply {
            outcome,
            text,
            cap_stops,
        } = d.step
        else {
            panic!("{:?}", d.step);
        };
        assert_eq!(outcome, RoundOutcome::NoQuery);
        assert_eq!(text, shipped("search-r1").no_query);
        assert!(cap_stops);
        // R1-Searcher has no such text: the rollout ends there.
        let d = Given::default().ends(
            "r1-searcher",
            query(" "),
            "<|begin_of_query|> <|end_of_query|>",
        );
        assert_eq!(d.step, finish(RoundOutcome::NoQuery, FinishReason::Stop));
    }

    /// R1-Searcher's loop keeps a round stripped up to its closing tag.
    #[test]
    fn a_stripping_profile_keeps_the_round_trimmed_before_its_closing_tag() {
        let kept = "\nFirst find the film. <|begin_of_query|> Titanic director <|end_of_query|>";
        let d = Given::default().ends("r1-searcher", query(" Titanic director "), kept);
        assert_eq!(
            d.keep,
            "First find the film. <|begin_of_query|> Titanic director<|end_of_query|>"
        );
        assert_eq!(d.step, searched(&["Titanic director"]));
    }

    /// RAG-R1 (multi-query) splits a call on "," and keeps at most three.
    #[test]
    fn a_multi_query_call_is_split_and_capped() {
        let d = Given::default().ends(
            "rag-r1-mq",
            query(" a, b, , c, d "),
            "<search> a, b, , c, d </search>",
        );
        let Step::Search(cleaned) = d.step else {
            panic!("{:?}", d.step);
        };
        assert_eq!(cleaned.queries, ["a", "b", "c"]);
        assert!(!cleaned.notes.is_empty(), "the dropped query is noted");
    }

    #[test]
    fn an_answer_ends_the_rollout_and_so_does_a_call_after_answer_text() {
        let kept = "<answer> Paris </answer>";
        let d = Given::default().ends("search-r1", Some(RoundEnd::Answer(" Paris ".into())), kept);
        assert_eq!(d.keep, kept);
        assert_eq!(d.step, finish(RoundOutcome::Answer, FinishReason::Stop));
        let given = Given {
            answer_started: true,
            ..Given::default()
        };
        let d = given.ends("search-r1", query("more"), "<search> more </search>");
        assert_eq!(d.step, finish(RoundOutcome::Answer, FinishReason::Stop));
    }

    #[test]
    fn a_stop_string_ends_the_answer_whatever_closed_the_round() {
        let given = Given {
            stopped: true,
            ..Given::default()
        };
        for end in [query("x"), None, Some(RoundEnd::Answer("x".into()))] {
            let d = given.ends("search-r1", end, "<answer> Pa");
            assert_eq!(d.keep, "<answer> Pa");
            assert_eq!(d.step, finish(RoundOutcome::Answer, FinishReason::Stop));
        }
    }

    #[test]
    fn an_invalid_action_gets_its_text_below_the_cap_and_ends_the_rollout_otherwise() {
        for end in [
            RoundEnd::Unmatched(crate::scanner::TagKind::QueryClose),
            RoundEnd::DocumentsOpened,
        ] {
            let d = Given::calls(3).ends("search-r1", Some(end.clone()), "oops </search>");
            assert_eq!(d.keep, "oops </search>");
            assert_eq!(
                d.step,
                Step::Reply {
                    outcome: RoundOutcome::InvalidAction,
                    text: shipped("search-r1").invalid_action,
                    cap_stops: false,
                }
            );
            let stop = finish(RoundOutcome::InvalidAction, FinishReason::Stop);
            let capped = Given::calls(4).ends("search-r1", Some(end.clone()), "x");
            assert_eq!(capped.step, stop);
            // R1-Searcher has no invalid-action text.
            let bare = Given::default().ends("r1-searcher", Some(end), "x");
            assert_eq!(bare.step, stop);
        }
    }

    #[test]
    fn the_engine_stopping_ends_the_rollout_at_eos_or_the_budget() {
        let given = Given::default();
        for profile in ["search-r1", "tool-search", "asearcher", "ircot"] {
            let eos = given.ends_with(profile, None, Some(EngineFinish::Stop), "Just text");
            assert_eq!(eos.keep, "Just text");
            assert_eq!(eos.step, finish(RoundOutcome::Eos, FinishReason::Stop));
            let length = given.ends_with(profile, None, Some(EngineFinish::Length), "Just te");
            assert_eq!(
                length.step,
                finish(RoundOutcome::Length, FinishReason::Length)
            );
        }
    }

    // Tool calls (Qwen's `<tool_call>` JSON).

    #[test]
    fn a_finished_turn_of_search_calls_is_planned_in_call_order() {
        let kept = turn(&[
            call("search", json!({"query": "Mona Lisa"})),
            call("search", json!({"query": ["Louvre", "Paris"]})),
            call("lookup", json!({})),
        ]);
        let d = Given::default().ends("tool-search", None, &kept);
        assert_eq!(d.keep, kept);
        let Step::Tools { calls, plans } = d.step else {
            panic!("{:?}", d.step);
        };
        assert_eq!(calls.len(), 3);
        assert_eq!(
            plans[0],
            CallPlan::Search(CleanedQueries {
                queries: vec!["Mona Lisa".into()],
                notes: Vec::new(),
            })
        );
        let CallPlan::Search(second) = &plans[1] else {
            panic!("{:?}", plans[1]);
        };
        assert_eq!(second.queries, ["Louvre", "Paris"]);
        assert!(
            matches!(&plans[2], CallPlan::Reply { .. }),
            "{:?}",
            plans[2]
        );
    }

    #[test]
    fn a_turn_cut_by_the_budget_is_not_run() {
        let kept = turn(&[call("search", json!({"query": "Mona Lisa"}))]);
        let d = Given::default().ends_with("tool-search", None, Some(EngineFinish::Length), &kept);
        assert_eq!(d.step, finish(RoundOutcome::Length, FinishReason::Length));
    }

    #[test]
    fn a_turn_at_the_cap_is_not_run_and_is_no_answer() {
        let kept = turn(&[call("search", json!({"query": "Mona Lisa"}))]);
        let d = Given::calls(4).ends("tool-search", None, &kept);
        assert_eq!(
            d.step,
            Step::Finish {
                outcome: RoundOutcome::Search,
                reason: FinishReason::Length,
                fallback: false,
            }
        );
    }

    /// The policy started writing the tool response itself: its turn ended.
    #[test]
    fn a_turn_ended_by_a_response_the_policy_wrote_runs_its_calls() {
        let kept = turn(&[call("search", json!({"query": "Mona Lisa"}))]);
        let d = Given::default().ends("tool-search", Some(RoundEnd::DocumentsOpened), &kept);
        assert!(matches!(d.step, Step::Tools { .. }), "{:?}", d.step);
        // With no call in it, it is an invalid action (tool-search has no text).
        let d = Given::default().ends("tool-search", Some(RoundEnd::DocumentsOpened), "Hmm");
        assert_eq!(
            d.step,
            finish(RoundOutcome::InvalidAction, FinishReason::Stop)
        );
    }

    #[test]
    fn the_answer_function_is_the_answer_and_a_repeated_query_gets_its_reply() {
        let kept = turn(&[call(
            "answer",
            json!({"answers": [" Leonardo ", "da Vinci"]}),
        )]);
        let d = Given::default().ends("tool-answer", None, &kept);
        assert_eq!(d.step, Step::AnswerCall("Leonardo, da Vinci".into()));

        let given = Given {
            rounds: vec![searched_round(&["mona lisa"])],
            ..Given::calls(1)
        };
        let kept = turn(&[call("search", json!({"query": [" Mona Lisa ", "Louvre"]}))]);
        let Step::Tools { plans, .. } = given.ends("tool-answer", None, &kept).step else {
            panic!("not a turn of calls");
        };
        let CallPlan::Search(cleaned) = &plans[0] else {
            panic!("{:?}", plans[0]);
        };
        assert_eq!(cleaned.queries, ["Louvre"]);
        let kept = turn(&[call("search", json!({"query": "MONA LISA"}))]);
        let Step::Tools { plans, .. } = given.ends("tool-answer", None, &kept).step else {
            panic!("not a turn of calls");
        };
        let repeated = shipped("tool-answer").tools.unwrap().repeated;
        assert!(matches!(&plans[0], CallPlan::Reply { text, .. } if *text == repeated));
    }

    #[test]
    fn calls_of_the_clients_functions_end_the_turn_as_the_client_allows() {
        let weather = json!({"type": "function", "function": {"name": "weather"}});
        let kept = turn(&[
            call("weather", json!({"city": "Paris"})),
            call("search", json!({"query": "Paris"})),
            call("weather", json!({"city": "Lyon"})),
        ]);
        let mut given = Given {
            client: ClientTools {
                functions: vec![weather],
                choice: ToolChoice::Auto,
                parallel: true,
            },
            ..Given::default()
        };
        let names = |step: Step| match step {
            Step::ClientCalls(calls) => calls
                .into_iter()
                .map(|call| call.arguments["city"].to_string())
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        let d = given.ends("tool-search", None, &kept);
        assert_eq!(d.keep, kept);
        assert_eq!(names(d.step), ["\"Paris\"", "\"Lyon\""]);
        given.client.parallel = false;
        assert_eq!(
            names(given.ends("tool-search", None, &kept).step),
            ["\"Paris\""]
        );
        // `tool_choice: "none"`: a call of theirs is text; seeker's own still runs.
        given.client.choice = ToolChoice::None;
        let Step::Tools { calls, .. } = given.ends("tool-search", None, &kept).step else {
            panic!("seeker's own call did not run");
        };
        assert_eq!(calls.len(), 1);
    }

    /// Tongyi DeepResearch: one call a turn, the turn kept stripped.
    #[test]
    fn a_stripping_tool_profile_keeps_the_turn_trimmed_and_one_call() {
        let calls = turn(&[
            call("search", json!({"query": ["a"]})),
            call("search", json!({"query": ["b"]})),
        ]);
        let kept = format!("\n\n<think>two</think>\n{calls}\n");
        let d = Given::default().ends("tongyi-deepresearch", None, &kept);
        assert_eq!(d.keep, kept.trim());
        let Step::Tools { calls, plans } = d.step else {
            panic!("{:?}", d.step);
        };
        assert_eq!((calls.len(), plans.len()), (1, 1));
        // Its `visit` function reads pages, with the call's goal.
        let kept = turn(&[call(
            "visit",
            json!({"url": [" https://example.org/a ", ""], "goal": "the date"}),
        )]);
        let Step::Tools { plans, .. } = Given::default()
            .ends("tongyi-deepresearch", None, &kept)
            .step
        else {
            panic!("not a turn of calls");
        };
        assert_eq!(
            plans,
            [CallPlan::Visit {
                urls: vec!["https://example.org/a".into()],
                goal: "the date".into(),
            }]
        );
    }

    /// Once answer text has streamed, a call the policy writes is no call.
    #[test]
    fn a_turn_after_answer_text_runs_nothing() {
        let given = Given {
            answer_started: true,
            ..Given::default()
        };
        let kept = turn(&[call("search", json!({"query": "Mona Lisa"}))]);
        let d = given.ends("tool-search", None, &kept);
        assert_eq!(d.step, finish(RoundOutcome::Eos, FinishReason::Stop));
    }

    // Page actions (ASearcher).

    #[test]
    fn a_page_action_opens_its_page_or_gets_the_failed_page_text() {
        let kept = "<access> https://example.org/a </access>";
        let page = |raw: &str| Some(RoundEnd::Page(raw.to_string()));
        let d = Given::default().ends("asearcher", page(" https://example.org/a "), kept);
        assert_eq!(d.keep, kept);
        assert_eq!(d.step, Step::OpenPage("https://example.org/a".into()));
        let d = Given::default().ends("asearcher", page("  "), "<access>  </access>");
        assert_eq!(d.step, Step::NoPage);
        let d = Given::calls(32).ends("asearcher", page("x"), "<access>x</access>");
        assert_eq!(d.step, finish(RoundOutcome::Page, FinishReason::Length));
    }

    /// The pause while reading a page wins over everything else.
    #[test]
    fn a_pause_reads_on() {
        let given = Given {
            stopped: true,
            ..Given::calls(32)
        };
        let d = given.ends("asearcher", Some(RoundEnd::Pause), "so far </think>");
        assert_eq!(d.keep, "so far </think>");
        assert_eq!(d.step, Step::ReadOn);
    }

    // IRCoT: no opening query tag, every sentence a query.

    #[test]
    fn an_ircot_sentence_is_its_query_and_the_answer_sentence_ends_it() {
        let kept = "Titanic was directed by James Cameron.";
        let d = Given::calls(4).ends(
            "ircot",
            query("Titanic was directed by James Cameron"),
            kept,
        );
        assert_eq!(d.keep, kept);
        assert_eq!(d.step, searched(&["Titanic was directed by James Cameron"]));
        let d = Given::calls(5).ends("ircot", query("More"), "More.");
        assert_eq!(d.step, finish(RoundOutcome::Search, FinishReason::Length));
        let d = Given::calls(2).ends(
            "ircot",
            Some(RoundEnd::Answer(" 1954".into())),
            "So the answer is: 1954.",
        );
        assert_eq!(d.step, finish(RoundOutcome::Answer, FinishReason::Stop));
    }
}
