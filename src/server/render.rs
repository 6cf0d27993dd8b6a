//! Rendering a rollout for the client, as pure functions of its events and
//! outcome: the `chat.completion.chunk`s of a stream ([`ChunkWriter`]) and
//! the `chat.completion` of a non-streamed request ([`completion`]). No I/O
//! here: the handler ([`super::chat`]) feeds the events and frames the chunks
//! as SSE.
//!
//! A stream is: one chunk with `delta.role = "assistant"`; per rollout event,
//! a chunk with `delta.reasoning_content` (reasoning, and spliced text marked
//! with `seeker.event = {"type": "splice"}`), `delta.content` (the answer) or
//! an empty delta carrying the search event in `seeker.event`; a last chunk
//! with `finish_reason`, the answer's `url_citation` annotations
//! (`delta.annotations`, when there are any) and the `seeker` information; with
//! `stream_options.include_usage`, a usage chunk with no choices (OpenAI's
//! shape).

use super::citations;
use super::openai::{
    AssistantRole, ChatAnnotation, ChatCompletion, ChatCompletionChunk, Choice, ChunkChoice,
    Citation, Delta, DeltaToolCall, FunctionCall, ResponseMessage, SearchHit, SeekerChunk,
    SeekerEvent, SeekerInfo, ToolCallObject, Usage,
};
use crate::rollout::{FinishReason, RolloutEvent, RolloutOutcome};

/// What the response says about how it was made, besides the rollout.
pub(crate) struct ResponseMeta {
    /// `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// The policy profile's name.
    pub policy: String,
    /// `return_transcript`: add the transcript and the rounds.
    pub return_transcript: bool,
}

impl ResponseMeta {
    /// A new response id, created now.
    pub fn new(model: String, policy: String, return_transcript: bool) -> Self {
        Self {
            id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model,
            policy,
            return_transcript,
        }
    }

    pub(crate) fn seeker_info(&self, outcome: &RolloutOutcome) -> SeekerInfo {
        SeekerInfo {
            policy: self.policy.clone(),
            searches: outcome.searches,
            documents: outcome.documents.iter().map(Citation::from).collect(),
            transcript: self.return_transcript.then(|| outcome.transcript.clone()),
            rounds: self.return_transcript.then(|| outcome.rounds.clone()),
            resumed: outcome.resumed,
        }
    }
}

/// The `chat.completion.chunk`s of one streamed response.
pub(crate) struct ChunkWriter {
    meta: ResponseMeta,
}

impl ChunkWriter {
    pub fn new(meta: ResponseMeta) -> Self {
        Self { meta }
    }

    /// The first chunk: `delta.role = "assistant"`.
    pub fn role(&self) -> ChatCompletionChunk {
        let delta = Delta {
            role: Some(AssistantRole::Assistant),
            ..Delta::default()
        };
        self.delta(delta, None, None)
    }

    /// The chunk for one rollout event.
    pub fn event(&self, event: RolloutEvent) -> ChatCompletionChunk {
        let (delta, event) = match event {
            RolloutEvent::Reasoning(text) => (reasoning(text), None),
            // Spliced text is trace too, marked so clients can tell it from
            // generated text.
            RolloutEvent::Splice(text) => (reasoning(text), Some(SeekerEvent::Splice)),
            RolloutEvent::Answer(text) => (
                Delta {
                    content: Some(text),
                    ..Delta::default()
                },
                None,
            ),
            RolloutEvent::Search {
                round,
                queries,
                notes,
            } => (
                Delta::default(),
                Some(SeekerEvent::Search {
                    round,
                    queries,
                    notes,
                }),
            ),
            RolloutEvent::RoundEnd {
                round,
                outcome,
                tokens_generated,
                prompt_tokens_cached,
            } => (
                Delta::default(),
                Some(SeekerEvent::Round {
                    round,
                    outcome,
                    tokens_generated,
                    prompt_tokens_cached,
                }),
            ),
            RolloutEvent::Results(r) => (
                Delta::default(),
                Some(SeekerEvent::Results {
                    round: r.round,
                    query: r.query,
                    backend: r.backend,
                    documents: r.documents.iter().map(SearchHit::from).collect(),
                    error: r.error,
                    error_kind: r.error_kind,
                    cached: r.cached,
                    failed_backends: r.failed_backends,
                }),
            ),
            RolloutEvent::OpenPage(p) => (
                Delta::default(),
                Some(SeekerEvent::OpenPage {
                    round: p.round,
                    target: p.target,
                    url: p.url,
                    title: p.title,
                    source: p.source,
                    chars: p.chars,
                    chunks: p.chunks,
                    error: p.error,
                    error_kind: p.error_kind,
                }),
            ),
        };
        self.delta(delta, None, event.map(|event| SeekerChunk::Event { event }))
    }

    /// The last chunk of a finished rollout: `finish_reason` and `seeker`.
    pub fn finish(&self, outcome: &RolloutOutcome) -> ChatCompletionChunk {
        let info = self.meta.seeker_info(outcome);
        let annotations = annotations(outcome);
        let delta = Delta {
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Delta::default()
        };
        self.delta(
            delta,
            Some(outcome.finish_reason),
            Some(SeekerChunk::Final(info)),
        )
    }

    /// The chunk of the client function calls that ended the rollout (each
    /// call whole, with its index), sent before [`Self::finish`]'s; `None`
    /// when the rollout called none.
    pub fn tool_calls(&self, outcome: &RolloutOutcome) -> Option<ChatCompletionChunk> {
        if outcome.tool_calls.is_empty() {
            return None;
        }
        let calls = tool_calls(outcome)
            .into_iter()
            .enumerate()
            .map(|(index, c)| DeltaToolCall {
                index,
                id: c.id,
                kind: c.kind,
                function: c.function,
            })
            .collect();
        let delta = Delta {
            tool_calls: Some(calls),
            ..Delta::default()
        };
        Some(self.delta(delta, None, None))
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage(&self, outcome: &RolloutOutcome) -> ChatCompletionChunk {
        self.chunk(Vec::new(), Some(usage(outcome)), None)
    }

    fn delta(
        &self,
        delta: Delta,
        finish_reason: Option<FinishReason>,
        seeker: Option<SeekerChunk>,
    ) -> ChatCompletionChunk {
        let choice = ChunkChoice {
            index: 0,
            delta,
            finish_reason,
        };
        self.chunk(vec![choice], None, seeker)
    }

    fn chunk(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Usage>,
        seeker: Option<SeekerChunk>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: super::openai::ChunkTag::Tag,
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices,
            usage,
            seeker,
        }
    }
}

fn reasoning(text: String) -> Delta {
    Delta {
        reasoning_content: Some(text),
        ..Delta::default()
    }
}

/// The trace text of an event for a non-streamed response's
/// `reasoning_content` (reasoning and spliced text), if it has any.
pub(crate) fn trace_text(event: &RolloutEvent) -> Option<&str> {
    match event {
        RolloutEvent::Reasoning(text) | RolloutEvent::Splice(text) => Some(text),
        _ => None,
    }
}

/// The non-streamed response: the answer in `content`, the trace (every
/// [`trace_text`], in order) in `reasoning_content`.
pub(crate) fn completion(
    meta: &ResponseMeta,
    outcome: &RolloutOutcome,
    reasoning: String,
) -> ChatCompletion {
    let calls = outcome.finish_reason == FinishReason::ToolCalls;
    ChatCompletion {
        id: meta.id.clone(),
        object: super::openai::ChatCompletionTag::Tag,
        created: meta.created,
        model: meta.model.clone(),
        choices: vec![Choice {
            index: 0,
            message: ResponseMessage {
                role: AssistantRole::Assistant,
                content: (!(calls && outcome.answer.is_empty())).then(|| outcome.answer.clone()),
                tool_calls: calls.then(|| tool_calls(outcome)),
                reasoning_content: reasoning,
                annotations: annotations(outcome),
            },
            finish_reason: outcome.finish_reason,
        }],
        usage: usage(outcome),
        seeker: meta.seeker_info(outcome),
    }
}

/// The client function calls that ended the rollout, OpenAI's shape.
fn tool_calls(outcome: &RolloutOutcome) -> Vec<ToolCallObject> {
    outcome
        .tool_calls
        .iter()
        .map(|c| ToolCallObject {
            id: c.id.clone(),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect()
}

/// The answer's citations in the Chat Completions shape.
fn annotations(outcome: &RolloutOutcome) -> Vec<ChatAnnotation> {
    citations::annotate(outcome)
        .into_iter()
        .map(ChatAnnotation::from)
        .collect()
}

fn usage(outcome: &RolloutOutcome) -> Usage {
    Usage {
        prompt_tokens: outcome.usage.prompt_tokens,
        completion_tokens: outcome.usage.completion_tokens,
        total_tokens: outcome.usage.prompt_tokens + outcome.usage.completion_tokens,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::rollout::{FinishReason, QueryRecord, RolloutUsage, RoundOutcome, RoundRecord};
    use crate::search::Document;

    fn meta(return_transcript: bool) -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            policy: "search-r1".into(),
            return_transcript,
        }
    }

    fn json(chunk: &ChatCompletionChunk) -> Value {
        serde_json::to_value(chunk).unwrap()
    }

    fn document() -> Document {
        Document {
            id: "7".into(),
            title: "Mona Lisa".into(),
            text: "A portrait by Leonardo da Vinci.".into(),
            url: Some("https://example.org/mona".into()),
            score: 3.5,
            backend: "tantivy".into(),
        }
    }

    fn outcome() -> RolloutOutcome {
        RolloutOutcome {
            answer: "Leonardo".into(),
            finish_reason: FinishReason::Length,
            usage: RolloutUsage {
                prompt_tokens: 30,
                completion_tokens: 12,
            },
            searches: 1,
            documents: vec![document()],
            tool_calls: Vec::new(),
            prompt: "<prompt>".into(),
            transcript: "<search> q </search>".into(),
            rounds: vec![RoundRecord {
                round: 1,
                outcome: RoundOutcome::Search,
                queries: vec!["q".into()],
                notes: Vec::new(),
                results: Vec::new(),
                pages: Vec::new(),
                tokens_generated: 12,
                prompt_tokens: None,
                prompt_tokens_cached: None,
            }],
            resumed: None,
        }
    }

    #[test]
    fn text_events_become_deltas_and_splices_are_marked() {
        let w = ChunkWriter::new(meta(false));
        let role = json(&w.role());
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["id"], "chatcmpl-1");
        assert_eq!(role["created"], 7);
        assert_eq!(role["model"], "m");
        assert_eq!(role["choices"][0]["delta"], json!({"role": "assistant"}));
        assert_eq!(role["choices"][0]["finish_reason"], Value::Null);
        assert!(role.get("seeker").is_none() && role.get("usage").is_none());

        let thought = json(&w.event(RolloutEvent::Reasoning("hmm".into())));
        assert_eq!(
            thought["choices"][0]["delta"],
            json!({"reasoning_content": "hmm"})
        );
        assert!(thought.get("seeker").is_none());

        let splice = json(&w.event(RolloutEvent::Splice("<information>".into())));
        assert_eq!(
            splice["choices"][0]["delta"],
            json!({"reasoning_content": "<information>"})
        );
        assert_eq!(splice["seeker"], json!({"event": {"type": "splice"}}));

        let answer = json(&w.event(RolloutEvent::Answer("Leo".into())));
        assert_eq!(answer["choices"][0]["delta"], json!({"content": "Leo"}));
    }

    #[test]
    fn search_events_ride_in_empty_deltas() {
        let w = ChunkWriter::new(meta(false));
        let search = json(&w.event(RolloutEvent::Search {
            round: 1,
            queries: vec!["mona lisa".into()],
            notes: Vec::new(),
        }));
        assert_eq!(search["choices"][0]["delta"], json!({}));
        assert_eq!(
            search["seeker"],
            json!({"event": {"type": "search", "round": 1, "queries": ["mona lisa"]}})
        );
        let results = json(&w.event(RolloutEvent::Results(QueryRecord {
            round: 1,
            query: "mona lisa".into(),
            backend: "tantivy".into(),
            documents: vec![document()],
            error: None,
            error_kind: None,
            cached: true,
            failed_backends: Vec::new(),
        })));
        assert_eq!(
            results["seeker"],
            json!({"event": {"type": "results", "round": 1, "query": "mona lisa", "cached": true,
                "backend": "tantivy",
                "documents": [{"id": "7", "title": "Mona Lisa", "url": "https://example.org/mona",
                    "backend": "tantivy", "score": 3.5,
                    "text": "A portrait by Leonardo da Vinci."}]}})
        );
        let failed = json(&w.event(RolloutEvent::Results(QueryRecord {
            round: 2,
            query: "q".into(),
            backend: "web".into(),
            documents: Vec::new(),
            error: Some("timed out".into()),
            error_kind: Some("timeout"),
            cached: false,
            failed_backends: Vec::new(),
        })));
        assert_eq!(failed["seeker"]["event"]["error"], "timed out");
        assert_eq!(failed["seeker"]["event"]["error_kind"], "timeout");
        assert_eq!(failed["seeker"]["event"]["documents"], json!([]));
        assert_eq!(failed["seeker"]["event"]["backend"], "web");
        let round = json(&w.event(RolloutEvent::RoundEnd {
            round: 1,
            outcome: RoundOutcome::Search,
            tokens_generated: 9,
            prompt_tokens_cached: None,
        }));
        assert_eq!(round["choices"][0]["delta"], json!({}));
        assert_eq!(
            round["seeker"],
            json!({"event": {"type": "round", "round": 1, "outcome": "search",
                "tokens_generated": 9}})
        );
    }

    #[test]
    fn the_last_chunks_carry_finish_reason_seeker_and_usage() {
        let w = ChunkWriter::new(meta(false));
        let last = json(&w.finish(&outcome()));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(
            last["choices"][0]["delta"]["annotations"][0]["url_citation"]["title"],
            "Mona Lisa"
        );
        assert_eq!(last["seeker"]["policy"], "search-r1");
        assert_eq!(last["seeker"]["searches"], 1);
        assert_eq!(last["seeker"]["documents"][0]["title"], "Mona Lisa");
        assert!(last["seeker"].get("transcript").is_none());
        assert!(last["seeker"].get("rounds").is_none());

        let usage = json(&w.usage(&outcome()));
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42})
        );

        let with_transcript = ChunkWriter::new(meta(true));
        let last = json(&with_transcript.finish(&outcome()));
        assert_eq!(last["seeker"]["transcript"], "<search> q </search>");
        assert_eq!(last["seeker"]["rounds"][0]["round"], 1);
    }

    #[test]
    fn a_completion_holds_answer_trace_usage_and_seeker() {
        let done = outcome();
        let c = serde_json::to_value(completion(&meta(true), &done, "trace".into())).unwrap();
        assert_eq!(c["object"], "chat.completion");
        assert_eq!(
            c["choices"][0]["message"],
            json!({"role": "assistant", "content": "Leonardo", "reasoning_content": "trace",
                "annotations": [{"type": "url_citation", "url_citation": {"start_index": 0,
                    "end_index": 8, "title": "Mona Lisa", "url": "https://example.org/mona"}}]})
        );

        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert_eq!(c["usage"]["total_tokens"], 42);
        assert_eq!(c["seeker"]["transcript"], "<search> q </search>");
        assert_eq!(trace_text(&RolloutEvent::Splice("doc".into())), Some("doc"));
        assert_eq!(trace_text(&RolloutEvent::Answer("a".into())), None);
        let mut uncited = outcome();
        uncited.answer = "Michelangelo".into();
        let c = serde_json::to_value(completion(&meta(false), &uncited, String::new())).unwrap();
        assert_eq!(c["choices"][0]["message"]["annotations"], json!([]));
    }
}
