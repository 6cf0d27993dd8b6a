//! A rollout as a Responses API `response`, built event by event: the
//! stream's events ([`ResponseWriter::event`]) and the finished object
//! ([`ResponseWriter::response`]) come from the same state, so a streamed
//! and a non-streamed request describe a rollout identically. Pure: no I/O.
//!
//! Items, in rollout order: text the policy writes opens (or extends) a
//! `reasoning` item; a search round is one `web_search_call` with every
//! query of the round (`action.queries`), opened when the round's queries
//! are known and completed when the next thing happens; each page read is a
//! `web_search_call` with an `open_page` action; the answer is the last item,
//! a `message` whose `output_text` carries the `url_citation` annotations
//! ([`super::super::citations`]). Spliced documents are not repeated in the
//! reasoning text: they are the search calls' sources.

use serde_json::{json, Value};

use super::types::{
    Annotation, IncompleteDetails, InputTokensDetails, OutputItem, OutputText, OutputTokensDetails,
    ReasoningText, ResponseError, ResponseObject, ResponseUsage, Source, WebSearchAction,
};
use crate::rollout::{ClientCall, FinishReason, PageRecord, RolloutEvent, RolloutOutcome};
use crate::server::citations::{self, document_url};
use crate::server::error::ApiError;
use crate::server::render::ResponseMeta;

/// One event of the stream: its type (the SSE `event:` name) and its JSON
/// (`type` and `sequence_number` included).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StreamEvent {
    pub kind: &'static str,
    pub data: Value,
}

/// The item being written.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Search {
        id: String,
        queries: Vec<String>,
        sources: Vec<Source>,
        results: usize,
        failed: usize,
    },
    Message {
        id: String,
        text: String,
    },
}

/// Builds one response; see the module documentation.
pub(crate) struct ResponseWriter {
    response: ResponseObject,
    meta: ResponseMeta,
    include_sources: bool,
    sequence: u64,
    open: Option<Open>,
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

impl ResponseWriter {
    /// `response` is the object as created (`status: in_progress`, no
    /// output); `meta` names the policy for `seeker`; `include_sources`:
    /// the request's `include` asked for `web_search_call.action.sources`.
    pub fn new(response: ResponseObject, meta: ResponseMeta, include_sources: bool) -> Self {
        Self {
            response,
            meta,
            include_sources,
            sequence: 0,
            open: None,
        }
    }

    /// The response as it stands (finished after [`Self::finish`]).
    pub fn response(&self) -> &ResponseObject {
        &self.response
    }

    fn emit(&mut self, kind: &'static str, mut data: Value) -> StreamEvent {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        StreamEvent { kind, data }
    }

    /// Index the open item has (or the next item will have) in `output`.
    fn index(&self) -> usize {
        self.response.output.len()
    }

    /// `{"response": …}` as the non-streamed body serialises it (through
    /// JSON text: `json!` would widen `f32` scores to `f64` digits).
    fn snapshot(&self) -> Value {
        let text = serde_json::to_string(&self.response).expect("response serialises");
        json!({ "response": serde_json::from_str::<Value>(&text).expect("valid JSON") })
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<StreamEvent> {
        let snapshot = self.snapshot();
        vec![
            self.emit("response.created", snapshot.clone()),
            self.emit("response.in_progress", snapshot),
        ]
    }

    /// The events of one rollout event.
    pub fn event(&mut self, event: RolloutEvent) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        match event {
            RolloutEvent::Reasoning(text) => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(&mut out, &[], "completed");
                    self.open_reasoning(&mut out);
                }
                let index = self.index();
                if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
                    all.push_str(&text);
                    let data = json!({"item_id": id, "output_index": index,
                        "content_index": 0, "delta": text});
                    out.push(self.emit("response.reasoning_text.delta", data));
                }
            }
            RolloutEvent::Answer(text) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(&mut out, &[], "completed");
                    self.open_message(&mut out);
                }
                let index = self.index();
                if let Some(Open::Message { id, text: all }) = &mut self.open {
                    all.push_str(&text);
                    let data = json!({"item_id": id, "output_index": index,
                        "content_index": 0, "delta": text, "logprobs": []});
                    out.push(self.emit("response.output_text.delta", data));
                }
            }
            RolloutEvent::Search { queries, .. } => {
                self.close(&mut out, &[], "completed");
                let id = new_id("ws");
                let action = self.search_action(&queries, &[]);
                let item = OutputItem::WebSearchCall {
                    id: id.clone(),
                    status: "in_progress".into(),
                    action,
                };
                let index = self.index();
                out.push(self.emit(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                ));
                let ids = json!({"item_id": id, "output_index": index});
                out.push(self.emit("response.web_search_call.in_progress", ids.clone()));
                out.push(self.emit("response.web_search_call.searching", ids));
                self.open = Some(Open::Search {
                    id,
                    queries,
                    sources: Vec::new(),
                    results: 0,
                    failed: 0,
                });
            }
            RolloutEvent::Results(record) => {
                if let Some(Open::Search {
                    sources,
                    results,
                    failed,
                    ..
                }) = &mut self.open
                {
                    *results += 1;
                    if record.error.is_some() {
                        *failed += 1;
                    }
                    for doc in &record.documents {
                        let url = document_url(doc);
                        if !sources.iter().any(|s| s.url == url) {
                            sources.push(Source {
                                kind: "url".into(),
                                url,
                            });
                        }
                    }
                }
            }
            RolloutEvent::OpenPage(page) => {
                self.close(&mut out, &[], "completed");
                self.page(&mut out, &page);
            }
            // Splices are the search calls' sources; round ends carry no item.
            RolloutEvent::Splice(_) | RolloutEvent::RoundEnd { .. } => {}
        }
        out
    }

    fn search_action(&self, queries: &[String], sources: &[Source]) -> WebSearchAction {
        WebSearchAction::Search {
            query: queries.first().cloned().unwrap_or_default(),
            queries: queries.to_vec(),
            sources: self.include_sources.then(|| sources.to_vec()),
        }
    }

    fn open_reasoning(&mut self, out: &mut Vec<StreamEvent>) {
        let id = new_id("rs");
        let index = self.index();
        let item = OutputItem::Reasoning {
            id: id.clone(),
            summary: Vec::new(),
            content: Vec::new(),
            status: "in_progress".into(),
        };
        out.push(self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        out.push(self.emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": {"type": "reasoning_text", "text": ""}}),
        ));
        self.open = Some(Open::Reasoning {
            id,
            text: String::new(),
        });
    }

    fn open_message(&mut self, out: &mut Vec<StreamEvent>) {
        let id = new_id("msg");
        let index = self.index();
        let item = OutputItem::Message {
            id: id.clone(),
            status: "in_progress".into(),
            role: "assistant".into(),
            content: Vec::new(),
        };
        out.push(self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        out.push(self.emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": output_text(String::new(), Vec::new())}),
        ));
        self.open = Some(Open::Message {
            id,
            text: String::new(),
        });
    }

    /// A page read, opened and finished at once (the read is over when the
    /// rollout reports it).
    fn page(&mut self, out: &mut Vec<StreamEvent>, page: &PageRecord) {
        let id = new_id("ws");
        let index = self.index();
        let action = WebSearchAction::OpenPage {
            url: page.url.clone().unwrap_or_else(|| page.target.clone()),
        };
        let mut item = OutputItem::WebSearchCall {
            id: id.clone(),
            status: "in_progress".into(),
            action,
        };
        out.push(self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        let ids = json!({"item_id": id, "output_index": index});
        out.push(self.emit("response.web_search_call.in_progress", ids.clone()));
        out.push(self.emit("response.web_search_call.searching", ids.clone()));
        out.push(self.emit("response.web_search_call.completed", ids));
        if let OutputItem::WebSearchCall { status, .. } = &mut item {
            *status = if page.error.is_some() {
                "failed"
            } else {
                "completed"
            }
            .into();
        }
        out.push(self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.response.output.push(item);
    }

    /// Closes the open item, if any; a message gets `annotations` and
    /// `message_status`.
    fn close(
        &mut self,
        out: &mut Vec<StreamEvent>,
        annotations: &[Annotation],
        message_status: &str,
    ) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                out.push(self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "text": text}),
                ));
                out.push(self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "part": {"type": "reasoning_text", "text": text}}),
                ));
                OutputItem::Reasoning {
                    id,
                    summary: Vec::new(),
                    content: vec![ReasoningText {
                        kind: "reasoning_text".into(),
                        text,
                    }],
                    status: "completed".into(),
                }
            }
            Open::Search {
                id,
                queries,
                sources,
                results,
                failed,
            } => {
                out.push(self.emit(
                    "response.web_search_call.completed",
                    json!({"item_id": id, "output_index": index}),
                ));
                let status = if results > 0 && failed == results {
                    "failed"
                } else {
                    "completed"
                };
                OutputItem::WebSearchCall {
                    id,
                    status: status.into(),
                    action: self.search_action(&queries, &sources),
                }
            }
            Open::Message { id, text } => {
                for (i, a) in annotations.iter().enumerate() {
                    out.push(self.emit(
                        "response.output_text.annotation.added",
                        json!({"item_id": id, "output_index": index, "content_index": 0,
                            "annotation_index": i, "annotation": a}),
                    ));
                }
                out.push(self.emit(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "text": text, "logprobs": []}),
                ));
                let part = output_text(text, annotations.to_vec());
                out.push(self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "part": part}),
                ));
                OutputItem::Message {
                    id,
                    status: message_status.into(),
                    role: "assistant".into(),
                    content: vec![part],
                }
            }
        };
        out.push(self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.response.output.push(item);
    }

    /// Ends a finished rollout: the answer's message (an empty one if the
    /// policy gave no answer) with its annotations, usage, `seeker`, and
    /// `response.completed` (or `response.incomplete` when the budget, the
    /// context or the round cap ended it).
    pub fn finish(&mut self, outcome: &RolloutOutcome) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let complete = outcome.finish_reason != FinishReason::Length;
        if !complete {
            self.response.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens".into(),
            });
        }
        let status = if complete { "completed" } else { "incomplete" };
        if outcome.finish_reason == FinishReason::ToolCalls {
            // The client's calls end the output: no message.
            self.close(&mut out, &[], "completed");
            for call in &outcome.tool_calls {
                self.function_call(&mut out, call);
            }
        } else {
            if !matches!(self.open, Some(Open::Message { .. })) {
                self.close(&mut out, &[], "completed");
                self.open_message(&mut out);
            }
            let annotations: Vec<Annotation> = citations::annotate(outcome)
                .into_iter()
                .map(|citation| Annotation {
                    kind: "url_citation".into(),
                    citation,
                })
                .collect();
            self.close(&mut out, &annotations, status);
        }
        self.response.status = status.into();
        self.response.usage = Some(usage(outcome));
        self.response.seeker = Some(self.meta.seeker_info(outcome));
        let kind = if complete {
            "response.completed"
        } else {
            "response.incomplete"
        };
        let data = self.snapshot();
        out.push(self.emit(kind, data));
        out
    }

    /// A call of a client function: added (arguments empty), the arguments
    /// in one delta, done.
    fn function_call(&mut self, out: &mut Vec<StreamEvent>, call: &ClientCall) {
        let id = new_id("fc");
        let index = self.index();
        let item = |arguments: &str, status: &str| OutputItem::FunctionCall {
            id: id.clone(),
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments.to_string(),
            status: status.into(),
        };
        out.push(self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item("", "in_progress")}),
        ));
        out.push(self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": call.arguments}),
        ));
        out.push(self.emit(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": call.arguments,
                "name": call.name}),
        ));
        let done = item(&call.arguments, "completed");
        out.push(self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        ));
        self.response.output.push(done);
    }

    /// Ends a rollout that failed after the stream started:
    /// `response.failed` with the error (the open item is kept, marked
    /// incomplete where items can be).
    pub fn fail(&mut self, error: &ApiError) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.close(&mut out, &[], "incomplete");
        self.response.status = "failed".into();
        self.response.error = Some(ResponseError {
            code: error.code.code().to_string(),
            message: error.message.clone(),
        });
        let data = self.snapshot();
        out.push(self.emit("response.failed", data));
        out
    }
}

fn output_text(text: String, annotations: Vec<Annotation>) -> OutputText {
    OutputText {
        kind: "output_text".into(),
        text,
        annotations,
        logprobs: Vec::new(),
    }
}

/// The Responses API's usage (see [`ResponseUsage`]'s fields).
fn usage(outcome: &RolloutOutcome) -> ResponseUsage {
    let generated: Vec<usize> = outcome
        .rounds
        .iter()
        .filter(|r| r.round > 0)
        .map(|r| r.tokens_generated)
        .collect();
    let before_last: usize = generated.iter().rev().skip(1).sum();
    let cached = outcome
        .rounds
        .iter()
        .filter_map(|r| r.prompt_tokens_cached)
        .sum();
    let u = outcome.usage;
    ResponseUsage {
        input_tokens: u.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: cached,
            cache_write_tokens: 0,
        },
        output_tokens: u.completion_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: before_last.min(u.completion_tokens),
        },
        total_tokens: u.prompt_tokens + u.completion_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::error::ErrorCode;

    fn writer() -> ResponseWriter {
        let response = ResponseObject {
            id: "resp_1".into(),
            object: crate::server::openai::ResponseTag::Tag,
            created_at: 1,
            status: "in_progress".into(),
            error: None,
            incomplete_details: None,
            instructions: None,
            max_output_tokens: None,
            model: "m".into(),
            output: Vec::new(),
            parallel_tool_calls: true,
            previous_response_id: None,
            store: false,
            temperature: None,
            top_p: None,
            text: json!({"format": {"type": "text"}}),
            tool_choice: json!("auto"),
            tools: Vec::new(),
            truncation: "disabled".into(),
            usage: None,
            metadata: json!({}),
            seeker: None,
        };
        let meta = ResponseMeta::new("m".into(), "asearcher".into(), false);
        ResponseWriter::new(response, meta, true)
    }

    fn page(error: Option<&str>) -> PageRecord {
        PageRecord {
            round: 1,
            target: "https://example.org/a".into(),
            url: error.is_none().then(|| "https://example.org/b".into()),
            title: "B".into(),
            source: "web".into(),
            chars: 10,
            chunks: 1,
            error: error.map(str::to_string),
            error_kind: error.map(|_| "refused"),
        }
    }

    #[test]
    fn a_page_read_is_an_open_page_call_marked_failed_when_it_failed() {
        let mut w = writer();
        let events = w.event(RolloutEvent::OpenPage(page(None)));
        let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.web_search_call.in_progress",
                "response.web_search_call.searching",
                "response.web_search_call.completed",
                "response.output_item.done"
            ]
        );
        let done = &events[4].data["item"];
        assert_eq!(
            done["action"],
            json!({"type": "open_page", "url": "https://example.org/b"})
        );
        assert_eq!(done["status"], "completed");
        let events = w.event(RolloutEvent::OpenPage(page(Some("refused"))));
        let done = &events[4].data["item"];
        assert_eq!(done["status"], "failed");
        assert_eq!(done["action"]["url"], "https://example.org/a");
        assert_eq!(w.response().output.len(), 2);
    }

    #[test]
    fn a_failure_ends_the_open_item_and_the_response() {
        let mut w = writer();
        w.start();
        w.event(RolloutEvent::Answer("Leo".into()));
        let err = ApiError::new(ErrorCode::RequestTimeout, "too slow");
        let events = w.fail(&err);
        let last = events.last().unwrap();
        assert_eq!(last.kind, "response.failed");
        assert_eq!(last.data["response"]["status"], "failed");
        assert_eq!(
            last.data["response"]["error"],
            json!({"code": "request_timeout", "message": "too slow"})
        );
        let message = &last.data["response"]["output"][0];
        assert_eq!(message["status"], "incomplete");
        assert_eq!(message["content"][0]["text"], "Leo");
        // Sequence numbers run on from the start events.
        // start 2, the answer 3 (added, part added, delta), the close 3.
        assert_eq!(last.data["sequence_number"], 2 + 3 + 3);
    }
}
