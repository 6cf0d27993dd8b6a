//! Tool-calling profiles through the search loop with a scripted engine: every
//! call form, the turn split at every byte, several calls and query arrays
//! searched at once, malformed calls answered with the policy's error text,
//! the tool-response turn spliced byte for byte.

use std::sync::Arc;

use seeker::chat::{ChatTurn, Role};
use seeker::engine::scripted::ScriptedEngine;
use seeker::profile::Profile;
use seeker::rollout::{
    FinishReason, RolloutError, RolloutEvent, RolloutOutcome, RolloutRequest, RoundOutcome,
};

use crate::common::{doc, profile, StaticBackend};

fn backend() -> Arc<StaticBackend> {
    StaticBackend::with(&[
        (
            "Toyota founding year",
            vec![doc(
                "8001",
                "Toyota",
                "Toyota Motor Corporation was founded in 1937 by Kiichiro Toyoda.",
            )],
        ),
        (
            "Kiichiro Toyoda",
            vec![doc(
                "8002",
                "Kiichiro Toyoda",
                "Kiichiro Toyoda was a Japanese businessman.",
            )],
        ),
    ])
}

fn ask(question: &str) -> RolloutRequest {
    RolloutRequest {
        messages: vec![ChatTurn::new(Role::User, question)],
        max_tokens: 512,
        temperature: None,
        top_p: None,
        continue_final_message: false,
        top_k: None,
        backend: None,
        stop: Vec::new(),
        client_tools: Default::default(),
    }
}

async fn rollout(
    profile: Profile,
    scripts: Vec<Vec<String>>,
    req: RolloutRequest,
) -> (
    Result<RolloutOutcome, RolloutError>,
    Vec<RolloutEvent>,
    ScriptedEngine,
) {
    let engine = ScriptedEngine::new(scripts).with_special_tokens(&["<|im_start|>", "<|im_end|>"]);
    let (result, events) = crate::common::run_scripted(&engine, profile, backend(), &req).await;
    (result, events, engine)
}

const TAGGED: &str = "I will look it up.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}\n</tool_call>";
const ANSWER: &str = "Toyota was founded in 1937.";
const RESPONSE: &str = "<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: \"Toyota\") Toyota Motor Corporation was founded in 1937 by Kiichiro Toyoda.\n</tool_response><|im_end|>\n<|im_start|>assistant\nAccording to the search results,";

fn searched(events: &[RolloutEvent]) -> Vec<Vec<String>> {
    events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::Search { queries, .. } => Some(queries.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_tagged_call_is_searched_and_answered_with_the_tool_response_turn() {
    let p = profile("tool-search");
    let (result, events, engine) = rollout(
        p,
        vec![vec![TAGGED.to_string()], vec![ANSWER.to_string()]],
        ask("When was Toyota founded?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, ANSWER);
    assert_eq!(outcome.finish_reason, FinishReason::Stop);
    assert_eq!(outcome.searches, 1);
    assert_eq!(outcome.transcript, format!("{TAGGED}{RESPONSE}{ANSWER}"));
    // The tools reached the chat template; the question is the user message.
    let prompts = engine.prompts();
    assert!(prompts[0].contains("\"name\":\"search\""), "{}", prompts[0]);
    assert!(prompts[0].ends_with(
        "<|im_start|>user\nWhen was Toyota founded?<|im_end|>\n<|im_start|>assistant\n"
    ));
    // The second round continues the model's call, byte for byte, then the response.
    assert_eq!(prompts[1], format!("{}{TAGGED}{RESPONSE}", outcome.prompt));
    assert_eq!(searched(&events), [["Toyota founding year"]]);
    let outcomes: Vec<RoundOutcome> = outcome.rounds.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [RoundOutcome::Search, RoundOutcome::Eos]);
    // The call is trace, the answer is content.
    let reasoning: String = events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::Reasoning(t) | RolloutEvent::Splice(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, format!("{TAGGED}{RESPONSE}{ANSWER}"));
}

#[tokio::test]
async fn the_call_split_at_every_byte_gives_the_same_rollout() {
    let p = profile("tool-search");
    let turn = "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}\n```".to_string();
    for text in [TAGGED.to_string(), turn] {
        let (whole, _, _) = rollout(
            p.clone(),
            vec![vec![text.clone()], vec![ANSWER.to_string()]],
            ask("q"),
        )
        .await;
        let whole = whole.unwrap();
        assert_eq!(whole.searches, 1, "{text}");
        for at in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            let pieces = vec![text[..at].to_string(), text[at..].to_string()];
            let (split, events, _) =
                rollout(p.clone(), vec![pieces, vec![ANSWER.to_string()]], ask("q")).await;
            let split = split.unwrap();
            assert_eq!(split.transcript, whole.transcript, "split at {at}");
            assert_eq!(split.answer, ANSWER, "split at {at}");
            assert_eq!(
                searched(&events),
                [["Toyota founding year"]],
                "split at {at}"
            );
        }
    }
}

#[tokio::test]
async fn fenced_and_bare_calls_are_searched_and_kept_as_written() {
    let p = profile("tool-search");
    for turn in [
        "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}\n```",
        "Searching: {\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}",
    ] {
        let (result, events, _) = rollout(
            p.clone(),
            vec![vec![turn.to_string()], vec![ANSWER.to_string()]],
            ask("q"),
        )
        .await;
        let outcome = result.unwrap();
        assert_eq!(outcome.transcript, format!("{turn}{RESPONSE}{ANSWER}"));
        assert_eq!(searched(&events), [["Toyota founding year"]]);
        assert_eq!(outcome.answer, ANSWER);
    }
}

#[tokio::test]
async fn every_query_of_every_call_in_a_turn_is_searched_at_once() {
    let p = profile("tool-search");
    let turn = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota founding year\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": [\"Kiichiro Toyoda\", \"nothing here\"]}}\n</tool_call>";
    let (result, events, _) = rollout(
        p,
        vec![vec![turn.to_string()], vec![ANSWER.to_string()]],
        ask("q"),
    )
    .await;
    let outcome = result.unwrap();
    // One search event for the turn: all three queries went out together.
    assert_eq!(
        searched(&events),
        [["Toyota founding year", "Kiichiro Toyoda", "nothing here"]]
    );
    assert_eq!(outcome.searches, 1);
    let expected = "<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: \"Toyota\") Toyota Motor Corporation was founded in 1937 by Kiichiro Toyoda.\n</tool_response>\n<tool_response>\nDoc 1(Title: \"Kiichiro Toyoda\") Kiichiro Toyoda was a Japanese businessman.\nNo results found.\n</tool_response><|im_end|>\n<|im_start|>assistant\nAccording to the search results,";
    assert_eq!(outcome.transcript, format!("{turn}{expected}{ANSWER}"));
}

#[tokio::test]
async fn malformed_calls_get_the_policys_error_text_and_the_rollout_goes_on() {
    let p = profile("tool-search");
    let turn = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota\n</tool_call>\n<tool_call>\n{\"name\": \"browse\", \"arguments\": {\"url\": \"http://x\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
    let (result, events, engine) = rollout(
        p,
        vec![vec![turn.to_string()], vec![ANSWER.to_string()]],
        ask("q"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, ANSWER);
    assert_eq!(outcome.searches, 0);
    assert!(searched(&events).is_empty());
    assert_eq!(outcome.rounds[0].outcome, RoundOutcome::NoQuery);
    // The trace says why each call did not run.
    let notes = &outcome.rounds[0].notes;
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes[0].starts_with("tool call 1: the tool call is not valid JSON"));
    assert!(notes[1].starts_with("tool call 2: unknown function \"browse\""));
    assert!(notes[2].contains("has no \"query\" argument"));
    let second = &engine.prompts()[1];
    let response = &second[outcome.prompt.len() + turn.len()..];
    assert!(
        response.starts_with(
            "<|im_end|>\n<|im_start|>user\n<tool_response>\nError: the tool call is not valid JSON"
        ),
        "{response}"
    );
    assert!(response.contains("<tool_response>\nError: unknown function \"browse\"; the functions are: search\n</tool_response>"), "{response}");
    assert!(response.contains("<tool_response>\nError: the call to \"search\" has no \"query\" argument\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{response}");
}

#[tokio::test]
async fn a_turn_without_a_call_is_the_answer_and_a_forged_response_is_cut() {
    let p = profile("tool-search");
    let (result, _, _) = rollout(p.clone(), vec![vec![ANSWER.to_string()]], ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!((outcome.answer.as_str(), outcome.searches), (ANSWER, 0));

    // The model writes the tool response itself: the turn ends before it,
    // and its call is run instead.
    let forged = format!("{TAGGED}\n<tool_response>\nmade up\n</tool_response>");
    let (result, _, _) = rollout(p, vec![vec![forged], vec![ANSWER.to_string()]], ask("q")).await;
    let outcome = result.unwrap();
    assert!(!outcome.transcript.contains("made up"));
    assert_eq!(outcome.transcript, format!("{TAGGED}\n{RESPONSE}{ANSWER}"));
}

#[tokio::test]
async fn a_continued_message_ending_in_a_call_is_searched_before_any_token() {
    let p = profile("tool-search");
    let mut req = ask("q");
    req.messages.push(ChatTurn::new(Role::Assistant, TAGGED));
    req.continue_final_message = true;
    let (result, events, engine) = rollout(p, vec![vec![ANSWER.to_string()]], req).await;
    let outcome = result.unwrap();
    assert_eq!(searched(&events), [["Toyota founding year"]]);
    assert_eq!(outcome.rounds[0].tokens_generated, 0);
    assert_eq!(engine.prompts().len(), 1);
    assert_eq!(outcome.transcript, format!("{TAGGED}{RESPONSE}{ANSWER}"));
}

#[tokio::test]
async fn past_the_round_cap_calls_are_not_run_and_are_no_answer() {
    let p = profile("tool-search");
    let scripts = vec![vec![TAGGED.to_string()]; 6];
    let (result, _, _) = rollout(p.clone(), scripts, ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.searches, p.max_searches);
    assert_eq!(outcome.finish_reason, FinishReason::Length);
    assert_eq!(outcome.answer, "");
}

#[tokio::test]
async fn recall_echoes_each_call_and_answers_in_boxed() {
    let p = profile("recall");
    let turn = " I should search.</think>\n<tool_call>\n{\"name\": \"wikipedia_search\", \"arguments\": {\"query\": \"Toyota founding year\", \"top_n\": 3}}\n</tool_call>";
    let answer_turn = " It was 1937.</think> Toyota was founded in \\[ \\boxed{1937} \\].";
    let (result, _, engine) = rollout(
        p,
        vec![vec![turn.to_string()], vec![answer_turn.to_string()]],
        ask("When was Toyota founded?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "1937");
    // ReCall's system prompt (training text), the tool schema as json.dumps(indent=4).
    let prompt = &engine.prompts()[0];
    assert!(prompt.starts_with("<|im_start|>system\nIn this environment you have access to a set of tools you can use to assist with the user query. You may perform multiple rounds of function calls. In each round, you can call one or more functions.\n\nHere are available functions in JSONSchema format: \n```json\n[\n    {\n        \"type\": \"function\",\n        \"function\": {\n            \"name\": \"wikipedia_search\","), "{prompt}");
    assert!(prompt.ends_with("</tool_call><|im_end|>\n<|im_start|>user\nWhen was Toyota founded?<|im_end|>\n<|im_start|>assistant\n<think>"), "{prompt}");
    // cat_tool_results: the call echoed as written, "result: \n", the documents.
    let expected = "<|im_end|>\n<|im_start|>user\n<tool_response>{\"name\": \"wikipedia_search\", \"arguments\": {\"query\": \"Toyota founding year\", \"top_n\": 3}}\nresult: \n\"Toyota\"\nToyota Motor Corporation was founded in 1937 by Kiichiro Toyoda.\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n<think>";
    assert_eq!(outcome.transcript, format!("{turn}{expected}{answer_turn}"));
}

#[tokio::test]
async fn tongyi_runs_the_first_call_of_a_turn_and_writes_google_style_results() {
    let p = profile("tongyi-deepresearch");
    let turn = "I need to search.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": [\"Toyota founding year\", \"nothing here\"]}}\n</tool_call>\n<tool_call>\n{\"name\": \"visit\", \"arguments\": {\"url\": [\"https://x\"], \"goal\": \"g\"}}\n</tool_call>\n";
    let (result, events, engine) = rollout(
        p.clone(),
        vec![
            vec![format!("{turn}<tool_response>\nmade up")],
            vec!["<tool_call>\n{\"name\": \"visit\", \"arguments\": {\"url\": [\"https://x\"], \"goal\": \"g\"}}\n</tool_call>".to_string()],
            vec!["<answer>1937</answer>".to_string()],
        ],
        ask("When was Toyota founded?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "1937");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let prompt = &engine.prompts()[0];
    assert!(
        prompt.starts_with("<|im_start|>system\nYou are a deep research assistant."),
        "{prompt}"
    );
    assert!(prompt.ends_with(&format!("</tool_call>\n\nCurrent date: {today}<|im_end|>\n<|im_start|>user\nWhen was Toyota founded?<|im_end|>\n<|im_start|>assistant\n")), "{prompt}");
    // Only the first call ran: both its queries at once, nothing for the visit.
    assert_eq!(
        searched(&events),
        [["Toyota founding year", "nothing here"]]
    );
    let first = "<|im_end|>\n<|im_start|>user\n<tool_response>\nA Google search for 'Toyota founding year' found 1 results:\n\n## Web Results\n1. [Toyota](8001)\n\nToyota Motor Corporation was founded in 1937 by Kiichiro Toyoda.\n=======\nA Google search for 'nothing here' found 0 results:\n\n## Web Results\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    let visit = "<tool_call>\n{\"name\": \"visit\", \"arguments\": {\"url\": [\"https://x\"], \"goal\": \"g\"}}\n</tool_call>";
    // No page reader in this dispatcher: the visit gets Tongyi's failure text.
    let second = "<|im_end|>\n<|im_start|>user\n<tool_response>\nThe useful information in https://x for user goal g as follows: \n\nEvidence in page: \nThe provided webpage content could not be accessed. Please check the URL or file format.\n\nSummary: \nThe webpage content could not be processed, and therefore, no information is available.\n\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    // The turn is kept stripped, cut before the response it started itself.
    assert_eq!(
        outcome.transcript,
        format!("{}{first}{visit}{second}<answer>1937</answer>", turn.trim())
    );
    assert!(!outcome.transcript.contains("made up"));
}

#[tokio::test]
async fn deepresearcher_prints_results_as_a_python_list_in_the_tool_turn() {
    let p = profile("deepresearcher");
    let turn = " plan </think>\n<tool_call>\n{\"name\": \"web_search\", \"arguments\": {\"query\": [\"Toyota founding year\", \"nothing here\", \"Kiichiro Toyoda\", \"a fourth\"]}}\n</tool_call>";
    let (result, events, engine) = rollout(
        p,
        vec![
            vec![turn.to_string()],
            vec!["<tool_call>\n{\"name\": \"browse_webpage\", \"arguments\": {\"url_list\": [\"u\"]}}\n</tool_call>".to_string()],
            vec![" done </think>\n<answer>1937</answer>".to_string()],
        ],
        ask("When was Toyota founded?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "1937");
    let prompt = &engine.prompts()[0];
    // The tools reach the chat template; the system prompt is dated.
    assert!(prompt.contains("\"name\":\"web_search\""), "{prompt}");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    assert!(
        prompt.contains(&format!("* Today is {today}\n")),
        "{prompt}"
    );
    assert!(
        prompt.ends_with("<|im_start|>assistant\n<think>"),
        "{prompt}"
    );
    // search_query_list[0:3]: the fourth query is dropped, visibly.
    assert_eq!(
        searched(&events),
        [["Toyota founding year", "nothing here", "Kiichiro Toyoda"]]
    );
    let first = "<|im_end|>\n<|im_start|>user\n<tool_response>\n[{'search_query': 'Toyota founding year', 'web_page_info_list': [{'title': 'Toyota', 'url': '', 'quick_summary': 'Toyota Motor Corporation was founded in 1937 by Kiichiro Toyoda.'}]}, {'search_query': 'nothing here', 'web_page_info_list': []}, {'search_query': 'Kiichiro Toyoda', 'web_page_info_list': [{'title': 'Kiichiro Toyoda', 'url': '', 'quick_summary': 'Kiichiro Toyoda was a Japanese businessman.'}]}]\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>";
    let browse = "<tool_call>\n{\"name\": \"browse_webpage\", \"arguments\": {\"url_list\": [\"u\"]}}\n</tool_call>";
    let second = "<|im_end|>\n<|im_start|>user\n<tool_response>\n[]\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>";
    assert_eq!(
        outcome.transcript,
        format!("{turn}{first}{browse}{second} done </think>\n<answer>1937</answer>")
    );
}
