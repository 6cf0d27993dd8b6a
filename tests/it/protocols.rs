//! Every profile driven by a scripted engine: golden two-round transcripts, and
//! one test per failure kind reported against search-loop implementations.

use std::sync::Arc;

use seeker::chat::{ChatTurn, Role};
use seeker::engine::scripted::ScriptedEngine;
use seeker::profile::Profile;
use seeker::rollout::{
    FinishReason, Resumed, RolloutError, RolloutEvent, RolloutOutcome, RolloutRequest, RoundOutcome,
};

use crate::common::{doc, profile, profiles, StaticBackend};

fn backend() -> Arc<StaticBackend> {
    StaticBackend::with(&[
        (
            "Mona Lisa painter",
            vec![
                doc(
                    "6055",
                    "Mona Lisa",
                    "The Mona Lisa is a portrait by Leonardo da Vinci.",
                ),
                doc(
                    "6758",
                    "Painting",
                    "Painting is the practice of applying paint.",
                ),
            ],
        ),
        (
            // IRCoT's sentence query (`two_round_script`).
            "The Mona Lisa was painted by Leonardo da Vinci",
            vec![doc(
                "6055",
                "Mona Lisa",
                "The Mona Lisa is a portrait by Leonardo da Vinci.",
            )],
        ),
        (
            "Leonardo da Vinci birthplace",
            vec![doc(
                "4790",
                "Leonardo da Vinci",
                "Leonardo was born in Vinci, Italy.",
            )],
        ),
    ])
}

fn request(messages: Vec<ChatTurn>) -> RolloutRequest {
    RolloutRequest {
        messages,
        max_tokens: 256,
        temperature: None,
        top_p: None,
        continue_final_message: false,
        top_k: None,
        backend: None,
        stop: Vec::new(),
        client_tools: Default::default(),
    }
}

fn ask(question: &str) -> RolloutRequest {
    request(vec![ChatTurn::new(Role::User, question)])
}

async fn rollout(
    profile: Profile,
    scripts: Vec<Vec<String>>,
    backend: Arc<StaticBackend>,
    req: RolloutRequest,
) -> (
    Result<RolloutOutcome, RolloutError>,
    Vec<RolloutEvent>,
    ScriptedEngine,
) {
    let engine = ScriptedEngine::new(scripts);
    let (result, events) = crate::common::run_scripted(&engine, profile, backend, &req).await;
    (result, events, engine)
}

fn pieces(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// A two-round script in `p`'s own tags, each tag split across pieces, with
/// text after each closing tag that must be discarded.
fn two_round_script(p: &Profile) -> Vec<Vec<String>> {
    let (qo, qc, ao, ac) = (
        &p.query_open,
        &p.query_close,
        &p.answer_open,
        &p.answer_close,
    );
    let query = if p.query_separator.is_empty() {
        " Mona Lisa painter ".to_string()
    } else {
        format!(
            " Mona Lisa painter{0} Leonardo da Vinci birthplace {0} ",
            p.query_separator
        )
    };
    if qo.is_empty() {
        // No opening tag (IRCoT): the sentence is the query, its full stop
        // closes it, and an article the model goes on to write is cut.
        let round1 = vec![
            "The Mona Lisa was painted".to_string(),
            " by Leonardo da Vinci".to_string(),
            format!("{qc}\nArticle: made up"),
        ];
        let round2 = vec![
            "So the ".to_string(),
            ao[..3].to_string(),
            format!("{} Leonardo da", &ao[3..]),
            format!(" Vinci{ac}"),
            " trailing".to_string(),
        ];
        return vec![round1, round2];
    }
    if let Some(tools) = &p.tools {
        // A tool call split across pieces, then a tool response the model
        // starts writing itself (its turn ends there).
        let call = format!(
            "call>\n{{\"name\": \"{}\", \"arguments\": {{\"{}\": \"Mona Lisa painter\"}}}}\n</tool_",
            tools.search, tools.query_argument
        );
        let round1 = vec![
            "<think>I need the painter.</think>\n".to_string(),
            "<tool_".to_string(),
            call,
            "call>".to_string(),
            "<tool_response>made up".to_string(),
        ];
        let round2 = vec![
            "<think>It is Leonardo.</think>\n".to_string(),
            ao[..1].to_string(),
            format!("{} Leonardo da", &ao[1..]),
            format!(" Vinci {}", &ac[..2]),
            format!("{} trailing", &ac[2..]),
        ];
        return vec![round1, round2];
    }
    let round1 = vec![
        "<think>I need the painter.</think>\n".to_string(),
        qo[..2].to_string(),
        format!("{}{query}", &qo[2..]),
        qc[..3].to_string(),
        format!("{}\n\n", &qc[3..]),
        "<information>made up".to_string(),
    ];
    let round2 = vec![
        "<think>It is Leonardo.</think>\n".to_string(),
        ao[..1].to_string(),
        format!("{} Leonardo da", &ao[1..]),
        format!(" Vinci {}", &ac[..2]),
        format!("{} trailing", &ac[2..]),
    ];
    vec![round1, round2]
}

#[tokio::test]
async fn golden_two_round_transcript_of_every_profile() {
    // Every profile that searches (the baselines `direct` and `rag` never
    // do: `baselines_answer_in_one_round_without_a_search_of_their_own`).
    for (name, p) in profiles().into_iter().filter(|(_, p)| p.max_searches > 0) {
        let script = two_round_script(&p);
        let (result, events, engine) = rollout(
            p.clone(),
            script,
            backend(),
            ask("Who painted the Mona Lisa"),
        )
        .await;
        let outcome = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(outcome.answer, "Leonardo da Vinci", "{name}");
        assert_eq!(outcome.finish_reason, FinishReason::Stop, "{name}");
        assert_eq!(outcome.searches, 1, "{name}");
        // The engine saw exactly the prompt, then the transcript so far.
        let prompts = engine.prompts();
        assert_eq!(prompts[0], outcome.prompt, "{name}");
        assert!(outcome
            .transcript
            .starts_with(&prompts[1][outcome.prompt.len()..]));
        // Nothing after a closing tag survives, and the made-up block never does.
        assert!(!outcome.transcript.contains("made up"), "{name}");
        assert!(!outcome.transcript.contains("trailing"), "{name}");
        // The answer streamed is the answer returned.
        let streamed: String = events
            .iter()
            .filter_map(|e| match e {
                RolloutEvent::Answer(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(streamed, outcome.answer, "{name}");
        // Dated prompts (Tongyi DeepResearch, DeepResearcher) are golden
        // whatever the day.
        let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
        insta::assert_snapshot!(
            format!("golden_{name}"),
            format!(
                "{}{}\n--- answer: {}",
                outcome.prompt, outcome.transcript, outcome.answer
            )
            .replace(&today, "{date}")
        );
    }
}

/// The evaluation baselines: `direct` answers with its whole reply and runs
/// no search, even one the model writes; `rag` searches the question once,
/// before the first token, and puts its documents in the system message.
#[tokio::test]
async fn baselines_answer_in_one_round_without_a_search_of_their_own() {
    let (result, _, engine) = rollout(
        profile("direct"),
        vec![pieces(&[" Leonardo", " da Vinci\n"])],
        backend(),
        ask("Who painted the Mona Lisa?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "Leonardo da Vinci");
    assert_eq!((outcome.searches, engine.prompts().len()), (0, 1));
    assert!(
        engine.prompts()[0].contains("based on your own knowledge"),
        "{}",
        engine.prompts()[0]
    );

    let searching = backend();
    let (result, _, _) = rollout(
        profile("direct"),
        vec![pieces(&["<search> Mona Lisa painter </search>"])],
        Arc::clone(&searching),
        ask("Who painted the Mona Lisa?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.finish_reason, FinishReason::Length);
    assert_eq!(outcome.searches, 0);
    assert!(searching.asked.lock().unwrap().is_empty(), "no search runs");

    let asked = backend();
    let (result, _, engine) = rollout(
        profile("rag"),
        vec![pieces(&["Leonardo da Vinci"])],
        Arc::clone(&asked),
        ask("Mona Lisa painter"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "Leonardo da Vinci");
    assert_eq!(*asked.asked.lock().unwrap(), ["Mona Lisa painter"]);
    let prompt = &engine.prompts()[0];
    let system = prompt.find("<|im_start|>system").unwrap();
    let user = prompt.find("<|im_start|>user").unwrap();
    let docs = prompt
        .find("Doc 1(Title: \"Mona Lisa\") The Mona Lisa is a portrait by Leonardo da Vinci.\nDoc 2(Title: \"Painting\")")
        .unwrap_or_else(|| panic!("{prompt}"));
    assert!(system < docs && docs < user, "{prompt}");
    assert!(
        prompt[user..].starts_with("<|im_start|>user\nQuestion: Mona Lisa painter<|im_end|>"),
        "{prompt}"
    );
}

/// `tool-answer`: a repeated query is answered by the profile's reminder
/// instead of being searched again, and a call of the answer function ends
/// the rollout with its names joined by commas.
#[tokio::test]
async fn tool_answer_reminds_a_repeated_query_and_ends_at_its_answer_call() {
    let call = |name: &str, args: &str| {
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
    };
    let search = call("search", r#"{"query": "Mona Lisa painter"}"#);
    let again = call("search", r#"{"query": " mona lisa PAINTER "}"#);
    let answer = call("answer", r#"{"answers": ["Leonardo da Vinci", "Salai"]}"#);
    let asked = backend();
    let (result, events, engine) = rollout(
        profile("tool-answer"),
        vec![
            pieces(&[&search]),
            pieces(&[&again]),
            pieces(&["<think>done</think>", &answer]),
        ],
        Arc::clone(&asked),
        ask("Who painted the Mona Lisa?"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "Leonardo da Vinci, Salai");
    assert_eq!(outcome.finish_reason, FinishReason::Stop);
    assert_eq!(outcome.searches, 1);
    assert_eq!(*asked.asked.lock().unwrap(), ["Mona Lisa painter"]);
    let third = &engine.prompts()[2];
    assert!(
        third.ends_with("<tool_response>\nYou have already searched for this. Use the results above: search for something else, or call answer.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        "{third}"
    );
    let outcomes: Vec<RoundOutcome> = outcome.rounds.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            RoundOutcome::Search,
            RoundOutcome::NoQuery,
            RoundOutcome::Answer
        ]
    );
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::Answer(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, outcome.answer);
}

fn search_r1_ask(scripts: &[&[&str]]) -> Vec<Vec<String>> {
    scripts.iter().map(|s| pieces(s)).collect()
}

#[tokio::test]
async fn a_stop_tag_glued_to_the_next_characters_is_cut_exactly() {
    let scripts = search_r1_ask(&[
        &["<search> Mona Lisa painter </search>.", " And more"],
        &["<answer> x </answer>"],
    ]);
    let (result, _, engine) = rollout(profile("search-r1"), scripts, backend(), ask("q")).await;
    result.unwrap();
    let second = &engine.prompts()[1];
    assert!(
        second.contains("</search>\n\n<information>Doc 1"),
        "{second}"
    );
    assert!(!second.contains("</search>."));
}

#[tokio::test]
async fn answer_before_search_ends_and_search_before_answer_searches() {
    let scripts = search_r1_ask(&[&["<answer> A </answer><search> Mona Lisa painter </search>"]]);
    let (result, _, _) = rollout(profile("search-r1"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!((outcome.answer.as_str(), outcome.searches), ("A", 0));

    let scripts = search_r1_ask(&[
        &["<search> Mona Lisa painter </search><answer> A </answer>"],
        &["<answer> B </answer>"],
    ]);
    let (result, _, _) = rollout(profile("search-r1"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!((outcome.answer.as_str(), outcome.searches), ("B", 1));
}

#[tokio::test]
async fn a_model_written_document_block_is_never_trusted() {
    let scripts = search_r1_ask(&[
        &[
            "I know this. <informa",
            "tion>Doc 1(Title: \"Fake\") fake evidence</information>",
        ],
        &["<answer> x </answer>"],
    ]);
    let (result, events, engine) =
        rollout(profile("search-r1"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert!(outcome.documents.is_empty());
    assert!(!outcome.transcript.contains("fake evidence"));
    // Search-R1's corrective sentence follows the cut.
    assert!(engine.prompts()[1].ends_with(
        "I know this. \nMy previous action is invalid. If I want to search, I should put the query \
         between <search> and </search>. If I want to give the final answer, I should put the \
         answer between <answer> and </answer>. Let me try again.\n"
    ));
    assert!(!events.iter().any(
        |e| matches!(e, RolloutEvent::Reasoning(t) | RolloutEvent::Splice(t) if t.contains("fake"))
    ));
    assert_eq!(outcome.rounds[0].outcome, RoundOutcome::InvalidAction);

    // R1-Searcher's evaluation ends the rollout instead.
    let scripts = search_r1_ask(&[&["I know. <|begin_of_documents|>(1)fake"]]);
    let (result, _, engine) = rollout(profile("r1-searcher"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!(engine.prompts().len(), 1);
    assert!(!outcome.transcript.contains("fake"));
}

/// A closing tag without its opening is an invalid action that stays in the
/// transcript; the streamed reasoning shows it where it stands, so reasoning
/// and splices read back as the transcript does.
#[tokio::test]
async fn an_unmatched_closing_tag_is_streamed_as_it_stays_in_the_transcript() {
    for (close, name) in [("</search>", "search"), ("</answer>", "answer")] {
        let scripts = search_r1_ask(&[
            &["<think>Found it.</think>", close],
            &["<answer> x </answer>"],
        ]);
        let (result, events, _) = rollout(profile("search-r1"), scripts, backend(), ask("q")).await;
        let outcome = result.unwrap();
        assert_eq!(
            outcome.rounds[0].outcome,
            RoundOutcome::InvalidAction,
            "{name}"
        );
        let streamed: String = events
            .iter()
            .filter_map(|e| match e {
                RolloutEvent::Reasoning(t) | RolloutEvent::Splice(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            streamed.starts_with(&format!(
                "<think>Found it.</think>{close}\nMy previous action"
            )),
            "{name}: {streamed:?}"
        );
        assert!(
            outcome.transcript.contains(&streamed),
            "{name}: {streamed:?}"
        );
    }
}

#[tokio::test]
async fn query_whitespace_is_normalised_and_empty_calls_get_the_no_query_text() {
    let scripts = search_r1_ask(&[
        &["<search>\n   Mona Lisa\r\n\tpainter\n</search>"],
        &["<search></search>"],
        &["<search>  \n </search>"],
        &["<answer> x </answer>"],
    ]);
    let backend = backend();
    let (result, _, engine) = rollout(
        profile("search-r1"),
        scripts,
        Arc::clone(&backend),
        ask("q"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(
        backend.asked.lock().unwrap().as_slice(),
        ["Mona Lisa painter"]
    );
    assert_eq!(outcome.searches, 1);
    let outcomes: Vec<RoundOutcome> = outcome.rounds.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            RoundOutcome::Search,
            RoundOutcome::NoQuery,
            RoundOutcome::NoQuery,
            RoundOutcome::Answer
        ]
    );
    assert!(engine.prompts()[2].ends_with("<search></search>\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"));
}

#[tokio::test]
async fn multi_query_calls_drop_empty_items_cap_visibly_and_search_at_once() {
    let scripts = search_r1_ask(&[
        &["<search> Mona Lisa painter, ,Leonardo da Vinci birthplace,, </search>"],
        &["<search> a, b, c, d </search>"],
        &["<answer> x </answer>"],
    ]);
    let backend = backend();
    let (result, events, _) = rollout(
        profile("rag-r1-mq"),
        scripts,
        Arc::clone(&backend),
        ask("q"),
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(
        outcome.rounds[0].queries,
        ["Mona Lisa painter", "Leonardo da Vinci birthplace"]
    );
    assert_eq!(outcome.rounds[1].queries, ["a", "b", "c"]);
    assert!(outcome.rounds[1].notes[0].contains("first 3 of 4"));
    assert!(events.iter().any(|e| matches!(
        e,
        RolloutEvent::Search { notes, .. } if notes.iter().any(|n| n.contains("first 3 of 4"))
    )));
    assert_eq!(backend.asked.lock().unwrap().len(), 5);
    assert!(outcome.transcript.contains(
        "\"query\": [\n    \"Mona Lisa painter\",\n    \"Leonardo da Vinci birthplace\"\n  ]"
    ));
}

#[tokio::test]
async fn a_long_query_is_truncated_visibly() {
    let long = format!("<search> {} </search>", "word ".repeat(200));
    let scripts = vec![vec![long], pieces(&["<answer> x </answer>"])];
    let (result, _, _) = rollout(profile("search-r1"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert!(outcome.rounds[0].queries[0].chars().count() <= 512);
    assert!(outcome.rounds[0].notes[0].contains("truncated to 512"));
}

#[tokio::test]
async fn r1_searcher_strips_the_round_and_puts_the_closing_tag_back() {
    let scripts = search_r1_ask(&[
        &["  I should search. <|begin_of_query|> \"Mona Lisa\" painter... <|end_of_query|>\n"],
        &["<answer> Leonardo </answer>"],
    ]);
    let (result, _, engine) = rollout(profile("r1-searcher"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.rounds[0].queries, ["Mona Lisa painter"]);
    let second = &engine.prompts()[1];
    assert!(second.ends_with(
        "Assistant: <think>I should search. <|begin_of_query|> \"Mona Lisa\" painter...<|end_of_query|>\n\n<|begin_of_documents|>\n(1)Title: Mona Lisa Text: The Mona Lisa is a portrait by Leonardo da Vinci.\n(2)Title: Painting Text: Painting is the practice of applying paint.\n<|end_of_documents|>\n\n"
    ), "{second}");
}

#[tokio::test]
async fn continuing_a_message_that_ends_in_a_search_call_searches_before_generating() {
    let req = request(vec![
        ChatTurn::new(Role::User, "Who painted the Mona Lisa?"),
        ChatTurn::new(
            Role::Assistant,
            "<think>Let me check.</think>\n<search> Mona Lisa painter </search>",
        ),
    ]);
    let req = RolloutRequest {
        continue_final_message: true,
        ..req
    };
    let scripts = search_r1_ask(&[&["<answer> Leonardo da Vinci </answer>"]]);
    let backend = backend();
    let (result, _, engine) =
        rollout(profile("search-r1"), scripts, Arc::clone(&backend), req).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "Leonardo da Vinci");
    assert_eq!(engine.prompts().len(), 1);
    let prompt = &engine.prompts()[0];
    assert!(prompt.contains(
        "<|im_start|>assistant\n<think>Let me check.</think>\n<search> Mona Lisa painter </search>\n\n<information>Doc 1(Title: \"Mona Lisa\")"
    ), "{prompt}");
    assert!(outcome
        .transcript
        .starts_with("<think>Let me check.</think>\n<search>"));
    assert_eq!(
        backend.asked.lock().unwrap().as_slice(),
        ["Mona Lisa painter"]
    );
    assert_eq!(outcome.usage.completion_tokens, 1);
}

/// A client resuming a rollout (an eval harness, an RL trainer) sends the
/// transcript so far: an answered call with its documents, then a new call.
/// The answered part is kept as written, only the new call is searched, and
/// the response says what it resumed from. Before: the rollout was cut at the
/// first `</search>`, the first query searched again and the rest dropped.
#[tokio::test]
async fn a_resumed_transcript_runs_only_its_trailing_call() {
    let head = "<think>First the painter.</think>\n<search> Mona Lisa painter </search>\n\n\
                <information>Doc 1(Title: \"Client\") the client's own document\n</information>\n\n\
                <think>Now where he was born.</think>\n";
    let message = format!("{head}<search> Leonardo da Vinci birthplace </search>");
    let req = RolloutRequest {
        continue_final_message: true,
        ..request(vec![
            ChatTurn::new(Role::User, "Where was the painter of the Mona Lisa born?"),
            ChatTurn::new(Role::Assistant, &message),
        ])
    };
    let scripts = search_r1_ask(&[&["<answer> Vinci </answer>"]]);
    let backend = backend();
    let (result, events, engine) =
        rollout(profile("search-r1"), scripts, Arc::clone(&backend), req).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "Vinci");
    assert_eq!(
        backend.asked.lock().unwrap().as_slice(),
        ["Leonardo da Vinci birthplace"]
    );
    assert_eq!(
        outcome.resumed,
        Some(Resumed {
            bytes: head.len(),
            calls: 1
        })
    );
    assert_eq!(outcome.searches, 1);
    // The client's message, byte for byte, then seeker's splice of the new call.
    let prompts = engine.prompts();
    assert_eq!(prompts.len(), 1);
    let expected = format!("{message}\n\n<information>Doc 1(Title: \"Leonardo da Vinci\")");
    assert!(prompts[0].contains(&expected), "{}", prompts[0]);
    assert!(outcome.transcript.starts_with(&message));
    // Reasoning and splices still add up to the transcript before the answer.
    let traced: String = events
        .iter()
        .filter_map(|e| match e {
            RolloutEvent::Reasoning(t) | RolloutEvent::Splice(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(outcome.transcript.starts_with(&traced), "{traced}");
    assert!(traced.starts_with(&message));
}

/// The client's answered calls count against the profile's `max_searches`:
/// with Search-R1's 4 already made, a fifth trailing call is not run.
#[tokio::test]
async fn a_resumed_transcripts_calls_count_against_max_searches() {
    let p = profile("search-r1");
    let answered =
        "<search> x </search>\n\n<information>y</information>\n\n".repeat(p.max_searches);
    let req = RolloutRequest {
        continue_final_message: true,
        ..request(vec![
            ChatTurn::new(Role::User, "q"),
            ChatTurn::new(
                Role::Assistant,
                format!("{answered}<search> Mona Lisa painter </search>"),
            ),
        ])
    };
    let backend = backend();
    let (result, _, engine) = rollout(p.clone(), vec![], Arc::clone(&backend), req).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.finish_reason, FinishReason::Length);
    assert!(backend.asked.lock().unwrap().is_empty());
    assert!(engine.prompts().is_empty());
    assert_eq!(outcome.resumed.map(|r| r.calls), Some(p.max_searches));
}

/// After its last answered call the message is trusted as written, so the
/// model continues right after it; an answer the client opened is continued
/// as the answer.
#[tokio::test]
async fn a_resumed_transcript_continues_after_its_documents_and_its_open_answer() {
    let head = "<search> Mona Lisa painter </search>\n\n<information>Doc 1(Title: \"Client\") c\n</information>\n\n";
    for (tail, script, answer) in [
        ("", "<answer> Leonardo </answer>", "Leonardo"),
        (
            "<think>So.</think>\n<answer> Leonardo",
            " da Vinci </answer>",
            "Leonardo da Vinci",
        ),
    ] {
        let message = format!("{head}{tail}");
        let req = RolloutRequest {
            continue_final_message: true,
            ..request(vec![
                ChatTurn::new(Role::User, "Who painted the Mona Lisa?"),
                ChatTurn::new(Role::Assistant, &message),
            ])
        };
        let backend = backend();
        let (result, _, engine) = rollout(
            profile("search-r1"),
            search_r1_ask(&[&[script]]),
            Arc::clone(&backend),
            req,
        )
        .await;
        let outcome = result.unwrap();
        assert_eq!(outcome.answer, answer, "{tail:?}");
        assert!(backend.asked.lock().unwrap().is_empty());
        assert!(engine.prompts()[0].ends_with(&message), "{tail:?}");
        assert_eq!(outcome.resumed.map(|r| r.calls), Some(1));
    }
}

#[tokio::test]
async fn continuing_requires_a_final_assistant_message() {
    let req = RolloutRequest {
        continue_final_message: true,
        ..ask("q")
    };
    let (result, _, _) = rollout(profile("search-r1"), vec![], backend(), req).await;
    assert!(matches!(result, Err(RolloutError::NothingToContinue)));
}

#[tokio::test]
async fn system_profiles_put_their_rules_first_and_the_think_prefix_after_the_prompt() {
    let req = request(vec![
        ChatTurn::new(Role::System, "client system prompt"),
        ChatTurn::new(Role::User, "Who painted the Mona Lisa?"),
    ]);
    let scripts = search_r1_ask(&[&["<answer> x </answer>"]]);
    let (result, _, engine) =
        rollout(profile("r1-searcher-instruct"), scripts, backend(), req).await;
    result.unwrap();
    let prompt = &engine.prompts()[0];
    assert!(
        prompt.starts_with("<|im_start|>system\nYou are a helpful assistant.\nGiven a question")
    );
    assert!(!prompt.contains("client system prompt"));
    assert!(prompt.ends_with(
        "<|im_start|>user\nWho painted the Mona Lisa?<|im_end|>\n<|im_start|>assistant\n<think>"
    ));
}

#[tokio::test]
async fn a_round_that_reaches_the_per_round_cap_ends_the_rollout() {
    let mut p = profile("r1-searcher");
    p.max_round_tokens = 3;
    let scripts = search_r1_ask(&[&["a", "b", "c", "d", "e"]]);
    let (result, _, _) = rollout(p, scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.finish_reason, FinishReason::Length);
    assert_eq!(outcome.usage.completion_tokens, 3);
}

/// The scripted engine's ChatML for one user message, with the generation prompt.
fn chatml_user(content: &str) -> String {
    format!("<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n")
}

/// The scripted engine's ChatML for a system and a user message, with the generation prompt.
fn chatml_system_user(system: &str, user: &str) -> String {
    format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n\
         <|im_start|>assistant\n"
    )
}

#[tokio::test]
async fn zerosearch_golden_prompt_doc_lines_no_query_text_and_answer() {
    let p = profile("zerosearch");
    assert_eq!(
        p.stop_strings(),
        ["</search>", "</answer>", "<|im_end|>", "<|endoftext|>"]
    );
    let scripts = search_r1_ask(&[
        &["<think>I need the painter.</think>\n<search> Mona Lisa painter </search>\n\n"],
        &["<search>  </search>"],
        &["<think>It is Leonardo.</think>\n<answer> Leonardo da Vinci </answer>"],
    ]);
    let (result, _, engine) =
        rollout(p, scripts, backend(), ask("  who painted the Mona Lisa ")).await;
    let outcome = result.unwrap();
    // Search-R1's instruction as inference.py writes it; the question stripped, "?" added.
    let prompt = chatml_user(
        "Answer the given question. You must conduct reasoning inside <think> and </think> first \
         every time you get new information. After reasoning, if you find you lack some \
         knowledge, you can call a search engine by <search> query </search> and it will return \
         the top searched results between <information> and </information>. You can search as \
         many times as your want. If you find no further external knowledge needed, you can \
         directly provide the answer inside <answer> and </answer>, without detailed \
         illustrations. For example, <answer> Beijing </answer>. Question: who painted the Mona \
         Lisa?\n",
    );
    let prompts = engine.prompts();
    assert_eq!(prompts[0], prompt);
    assert_eq!(outcome.rounds[0].queries, ["Mona Lisa painter"]);
    // "Doc i: text" lines, stripped, in Search-R1's trained block.
    let after_search = format!(
        "{prompt}<think>I need the painter.</think>\n<search> Mona Lisa painter </search>\
         \n\n<information>Doc 1: The Mona Lisa is a portrait by Leonardo da Vinci.\nDoc 2: \
         Painting is the practice of applying paint.</information>\n\n"
    );
    assert_eq!(prompts[1], after_search);
    // A call without a query: inference.py's text in the block.
    assert_eq!(outcome.rounds[1].outcome, RoundOutcome::NoQuery);
    assert_eq!(
        prompts[2],
        format!(
            "{after_search}<search>  </search>\n\n<information>No information available\
             </information>\n\n"
        )
    );
    assert_eq!(outcome.answer, "Leonardo da Vinci");
    assert_eq!(outcome.searches, 1);
}

#[tokio::test]
async fn research_golden_system_prompt_result_block_nothing_to_search_and_boxed_answer() {
    let scripts = search_r1_ask(&[
        &["<think>I need the painter.</think> <search> Mona Lisa painter </search> <result>"],
        &["<think>One more?</think> <search></search>"],
        &[
            "<think>It is Leonardo.</think> <answer> The final answer is \\[ \\boxed{Leonardo da \
             Vinci} \\] </answer>",
        ],
    ]);
    let (result, _, engine) = rollout(
        profile("research"),
        scripts,
        backend(),
        ask("Who painted the Mona Lisa?"),
    )
    .await;
    let outcome = result.unwrap();
    // re_search_template_sys as the system message, the question as the user message.
    let prompt = chatml_system_user(
        "You are a helpful assistant that can solve the given question step by step with the \
         help of the wikipedia search tool. Given a question, you need to first think about the \
         reasoning process in the mind and then provide the answer. During thinking, you can \
         invoke the wikipedia search tool to search for fact information about specific topics \
         if needed. The reasoning process and answer are enclosed within <think> </think> and \
         <answer> </answer> tags respectively, and the search query and result are enclosed \
         within <search> </search> and <result> </result> tags respectively. For example, \
         <think> This is the reasoning process. </think> <search> search query here </search> \
         <result> search result here </result> <think> This is the reasoning process. </think> \
         <answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. In the last part \
         of the answer, the final exact answer is enclosed within \\boxed{} with latex format.",
        "Who painted the Mona Lisa?",
    );
    let prompts = engine.prompts();
    assert_eq!(prompts[0], prompt);
    assert_eq!(outcome.rounds[0].queries, ["Mona Lisa painter"]);
    // One space, then the corpus contents separated by blank lines, and nothing after </result>.
    let after_search = format!(
        "{prompt}<think>I need the painter.</think> <search> Mona Lisa painter </search> \
         <result>\n\"Mona Lisa\"\nThe Mona Lisa is a portrait by Leonardo da Vinci.\n\n\
         \"Painting\"\nPainting is the practice of applying paint.\n</result>"
    );
    assert_eq!(prompts[1], after_search);
    assert_eq!(outcome.rounds[1].outcome, RoundOutcome::NoQuery);
    assert_eq!(
        prompts[2],
        format!(
            "{after_search}<think>One more?</think> <search></search> <result>\nnothing to \
             search\n</result>"
        )
    );
    // The whole answer: seeker does not unwrap \boxed{} (the reference scores its content).
    assert_eq!(
        outcome.answer,
        "The final answer is \\[ \\boxed{Leonardo da Vinci} \\]"
    );
    assert_eq!(outcome.searches, 1);
}

#[tokio::test]
async fn r_search_golden_system_prompt_observation_block_and_plain_text_answer() {
    let scripts = search_r1_ask(&[
        &["First I find the painter. <search> Mona Lisa painter </search>\n"],
        &[
            "<original_evidence>The Mona Lisa is a portrait by Leonardo da Vinci.\
             </original_evidence>\n<answer> Leonardo da Vinci </answer>",
        ],
    ]);
    let (result, _, engine) = rollout(
        profile("r-search"),
        scripts,
        backend(),
        ask("Who painted the Mona Lisa"),
    )
    .await;
    let outcome = result.unwrap();
    // The system prompt of the training data; the question with "?" as the user message.
    let prompt = chatml_system_user(
        "You are a helpful assistant that can solve the given question step by step. For each \
         step, start by explaining your thought process. If additional information is needed, \
         provide a specific query enclosed in <search> and </search>. The system will return the \
         top search results within <observation> and </observation>. You can perform multiple \
         searches as needed.\nWhen you know the final answer, use <original_evidence> and \
         </original_evidence> to provide all potentially relevant original information from the \
         observations. Ensure the information is complete and preserves the original wording \
         without modification. If no searches were conducted or observations were made, omit the \
         evidence section. Finally, provide the final answer within <answer> and </answer> tags.",
        "Who painted the Mona Lisa?",
    );
    let prompts = engine.prompts();
    assert_eq!(prompts[0], prompt);
    assert_eq!(outcome.rounds[0].queries, ["Mona Lisa painter"]);
    // "(Title: t) text" lines, no numbers, stripped, in <observation> between blank lines.
    assert_eq!(
        prompts[1],
        format!(
            "{prompt}First I find the painter. <search> Mona Lisa painter </search>\n\n\
             <observation>(Title: \"Mona Lisa\") The Mona Lisa is a portrait by Leonardo da \
             Vinci.\n(Title: \"Painting\") Painting is the practice of applying paint.\
             </observation>\n\n"
        )
    );
    assert_eq!(outcome.answer, "Leonardo da Vinci");

    // Without an answer tag, the final round's text is the prediction (src/eval/main.py).
    let scripts = search_r1_ask(&[
        &["<search> Mona Lisa painter </search>"],
        &["It was painted by Leonardo da Vinci. "],
    ]);
    let (result, _, _) = rollout(profile("r-search"), scripts, backend(), ask("q")).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.answer, "It was painted by Leonardo da Vinci.");
    assert_eq!(outcome.finish_reason, FinishReason::Stop);
}

#[tokio::test]
async fn stepsearch_golden_prompt_spaced_information_block_and_warning() {
    let scripts = search_r1_ask(&[
        &[
            "<think> plan to search: (Q1) painter of the Mona Lisa </think>\n<search> Mona Lisa \
             painter </search>",
        ],
        &["<think>Found it.</think></search>"],
        &["<answer> Leonardo da Vinci </answer>"],
    ]);
    let (result, _, engine) = rollout(
        profile("stepsearch"),
        scripts,
        backend(),
        ask("Who painted the Mona Lisa"),
    )
    .await;
    let outcome = result.unwrap();
    // The <think> prompt of hotpot_search.py / nq_search.py, "Question:" without a space.
    let prompt = chatml_user(
        "## Background\nYou are a deep AI research assistant. I will give you a single-hop or \
         multi-hop question. You don't have to answer the question now, but you should first \
         think about your research plan or what to search for next. You can use search to fill \
         in knowledge gaps. \n## Response format: Your output format should be one of the \
         following two formats: \n<think>your thinking process</think>\n<answer>your answer \
         after getting enough information</answer>\nor\n<think>your thinking \
         process</think>\nuse <search>search keywords</search> to search for information. For \
         example, <think> plan to search: (Q1) (Q2) (Q3) ... </think> <search> (Q1) question \
         </search> <think> reasoning ... </think> <answer> Beijing </answer>.\nThe search engine \
         will return the results contained in <information> and </information>. \nPlease follow \
         the loop of think, search, information, think, search, information, and answer until \
         the original question is finally solved. \nNote: The retrieval results may not contain \
         the answer or contain noise. You need to tell whether there is a golden answer. If not, \
         you need to correct the search query and search again. Question:Who painted the Mona \
         Lisa?\n",
    );
    let prompts = engine.prompts();
    assert_eq!(prompts[0], prompt);
    assert_eq!(outcome.rounds[0].queries, ["Mona Lisa painter"]);
    // A space inside each tag; "Doc i<## Title: t ##> text" lines, top-3.
    let after_search = format!(
        "{prompt}<think> plan to search: (Q1) painter of the Mona Lisa </think>\n<search> Mona \
         Lisa painter </search>\n\n<information> Doc 1<## Title: Mona Lisa ##> The Mona Lisa is \
         a portrait by Leonardo da Vinci.\nDoc 2<## Title: Painting ##> Painting is the practice \
         of applying paint. </information>\n\n"
    );
    assert_eq!(prompts[1], after_search);
    // A closing tag without its opening tag: StepSearch's warning.
    assert_eq!(outcome.rounds[1].outcome, RoundOutcome::InvalidAction);
    let warning = "\n<warning> My previous action is invalid. If I want to search, I should put \
                   the query between <search> and </search>. If I want to give the final answer, \
                   I should put the answer between <answer> and </answer>. Let me try again. \
                   </warning>\n";
    assert_eq!(
        prompts[2],
        format!("{after_search}<think>Found it.</think></search>{warning}")
    );
    assert_eq!(outcome.answer, "Leonardo da Vinci");
}

#[tokio::test]
async fn parallelsearch_golden_prompt_sub_queries_searched_at_once_in_one_block() {
    let p = profile("parallelsearch");
    // Split on "##", each sub-query stripped, empty ones dropped.
    assert_eq!(
        p.clean_queries(" Mona Lisa painter ## Leonardo da Vinci birthplace ")
            .queries,
        ["Mona Lisa painter", "Leonardo da Vinci birthplace"]
    );
    assert_eq!(
        p.clean_queries("a##b ## ## c#d ###e").queries,
        ["a", "b", "c#d", "#e"]
    );
    let scripts = search_r1_ask(&[
        &[
            "<think>Two facts.</think>\n<search> Mona Lisa painter ## Leonardo da Vinci \
             birthplace </search>",
        ],
        &["<think>Vinci.</think>\n<answer> Vinci, Italy </answer>"],
    ]);
    let backend = backend();
    let (result, _, engine) = rollout(
        p,
        scripts,
        Arc::clone(&backend),
        ask("Where was the painter of the Mona Lisa born"),
    )
    .await;
    let outcome = result.unwrap();
    // Search-R1's instruction with ParallelSearch's sentence on "##" sub-questions.
    let prompt = chatml_user(
        "Answer the given question. You must conduct reasoning inside <think> and </think> first \
         every time you get new information. After reasoning, if you find you lack some \
         knowledge, you can call a search engine by <search> query </search> and it will return \
         the top searched results between <information> and </information>. If the original \
         query is complex or involves multiple parts, you are encouraged to decompose it into \
         smaller sub-questions, separated by ##. For example: <search> sub-question 1 ## \
         sub-question 2 </search>. You can search as many times as your want. If you find no \
         further external knowledge needed, you can directly provide the answer inside <answer> \
         and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. \
         Question: Where was the painter of the Mona Lisa born?\n",
    );
    let prompts = engine.prompts();
    assert_eq!(prompts[0], prompt);
    assert_eq!(
        outcome.rounds[0].queries,
        ["Mona Lisa painter", "Leonardo da Vinci birthplace"]
    );
    let mut asked = backend.asked.lock().unwrap().clone();
    asked.sort();
    assert_eq!(asked, ["Leonardo da Vinci birthplace", "Mona Lisa painter"]);
    // One block; Doc numbering starts again at 1 for the second sub-query.
    assert_eq!(
        prompts[1],
        format!(
            "{prompt}<think>Two facts.</think>\n<search> Mona Lisa painter ## Leonardo da Vinci \
             birthplace </search>\n\n<information>Doc 1(Title: \"Mona Lisa\") The Mona Lisa is \
             a portrait by Leonardo da Vinci.\nDoc 2(Title: \"Painting\") Painting is the \
             practice of applying paint.\nDoc 1(Title: \"Leonardo da Vinci\") Leonardo was born \
             in Vinci, Italy.</information>\n\n"
        )
    );
    assert_eq!(outcome.searches, 1);
    assert_eq!(outcome.answer, "Vinci, Italy");
}
