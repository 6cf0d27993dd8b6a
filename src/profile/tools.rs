//! What a tool-calling profile does with a turn's calls: which queries a
//! call searches (or why it cannot run), and the tool-response text spliced
//! after the turn, byte for byte as the policy reads it.

use serde_json::Value;

use super::{CleanedQueries, Profile, QueryOutcome, Tools};
use crate::pages::Page;
use crate::toolcall::{Invocation, ToolCall};

/// What one call of a turn asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallPlan {
    /// Search these queries (cleaned, capped: never empty).
    Search(CleanedQueries),
    /// Reply with `text` instead: the profile's error text for a call that
    /// cannot run, or its `unavailable` text for a page read; `reason` says
    /// why in seeker's words (for the trace: a policy's error text may not).
    Reply { text: String, reason: String },
    /// Read these pages (URLs or corpus documents, in order; never empty),
    /// with the call's goal (empty when it gave none).
    Visit { urls: Vec<String>, goal: String },
}

/// One call's outcome, as the tool response renders it.
#[derive(Clone, Debug)]
pub enum ToolResult<'a> {
    /// The call searched: each query with its outcome, in order.
    Search(Vec<(&'a str, QueryOutcome<'a>)>),
    /// The call was answered with this text (see [`CallPlan::Reply`]).
    Reply(&'a str),
    /// The call read pages: each target with the page or why not, and the goal.
    Visit(Vec<(&'a str, Result<&'a Page, &'a str>)>, &'a str),
}

impl Profile {
    /// What `call` asks for. Only for profiles with `[tools]` (others get a
    /// reply saying so).
    pub fn plan_call(&self, call: &ToolCall) -> CallPlan {
        let Some(tools) = &self.tools else {
            let reason = "this policy has no tools".to_string();
            return CallPlan::Reply {
                text: reason.clone(),
                reason,
            };
        };
        let invocation = match &call.parsed {
            Ok(invocation) => invocation,
            Err(e) => return tool_error(tools, e.clone()),
        };
        if !tools.visit.is_empty() && invocation.name == tools.visit && tools.page.is_some() {
            return self.plan_visit(tools, invocation);
        }
        if !tools.visit.is_empty() && invocation.name == tools.visit {
            return CallPlan::Reply {
                text: tools.unavailable.clone(),
                reason: format!(
                    "\"{}\" reads pages, which seeker cannot do yet",
                    tools.visit
                ),
            };
        }
        if !tools.answer.is_empty() && invocation.name == tools.answer {
            // A usable answer call ends the rollout before calls are planned
            // (`answer_of`): this one's argument is unusable.
            return tool_error(
                tools,
                format!(
                    "the call to \"{}\" needs \"{}\": a string or an array of strings",
                    tools.answer, tools.answer_argument
                ),
            );
        }
        if invocation.name != tools.search {
            return tool_error(
                tools,
                format!(
                    "unknown function \"{}\"; the functions are: {}",
                    invocation.name,
                    function_names(tools).join(", ")
                ),
            );
        }
        self.plan_search(tools, invocation)
    }

    /// The answer a turn's `calls` give through the profile's answer
    /// function: the first call of it whose argument is a non-empty string,
    /// or an array of strings (trimmed, empty ones dropped, joined by
    /// `", "`, PhantomWiki's and most set answers' separator). `None` when
    /// the profile has no answer function or no call gives one.
    pub fn answer_of(&self, calls: &[ToolCall]) -> Option<String> {
        let tools = self.tools.as_ref().filter(|t| !t.answer.is_empty())?;
        calls.iter().find_map(|call| {
            let invocation = call.parsed.as_ref().ok()?;
            if invocation.name != tools.answer {
                return None;
            }
            let parts: Vec<String> = match invocation.arguments.get(&tools.answer_argument)? {
                Value::String(s) => vec![s.trim().to_string()],
                Value::Array(items) => items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => Some(s.trim().to_string()),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?,
                Value::Number(n) => vec![n.to_string()],
                _ => return None,
            };
            let parts: Vec<String> = parts.into_iter().filter(|p| !p.is_empty()).collect();
            (!parts.is_empty()).then(|| parts.join(", "))
        })
    }

    /// A call of the `visit` function (the profile reads pages): its URLs,
    /// trimmed, empty ones dropped, capped at `max_queries`, and its goal;
    /// or the profile's error text when the URL argument is missing, not a
    /// string or array of strings, or holds no URL.
    fn plan_visit(&self, tools: &Tools, invocation: &Invocation) -> CallPlan {
        let arg = &tools.url_argument;
        let not_strings = || format!("\"{arg}\" must be a string or an array of strings");
        let urls: Vec<String> = match invocation.arguments.get(arg) {
            Some(Value::String(u)) => vec![u.trim().to_string()],
            Some(Value::Array(items)) => match items
                .iter()
                .map(|v| v.as_str().map(|u| u.trim().to_string()))
                .collect::<Option<Vec<_>>>()
            {
                Some(urls) => urls,
                None => return tool_error(tools, not_strings()),
            },
            None | Some(Value::Null) => {
                return tool_error(
                    tools,
                    format!("the call to \"{}\" has no \"{arg}\" argument", tools.visit),
                )
            }
            Some(_) => return tool_error(tools, not_strings()),
        };
        let mut urls: Vec<String> = urls.into_iter().filter(|u| !u.is_empty()).collect();
        if urls.is_empty() {
            return tool_error(tools, format!("\"{arg}\" holds no URL"));
        }
        // Pages per call are capped like queries.
        urls.truncate(self.max_queries);
        let goal = invocation
            .arguments
            .get(&tools.goal_argument)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        CallPlan::Visit { urls, goal }
    }

    /// A call of the search function: its queries, each cleaned as a tag
    /// query is, capped at `max_queries` (with a note on what was dropped);
    /// or the profile's error text when the query argument is missing, not a
    /// string or array of strings, or holds no query once cleaned.
    fn plan_search(&self, tools: &Tools, invocation: &Invocation) -> CallPlan {
        let arg = &tools.query_argument;
        let not_strings = || format!("\"{arg}\" must be a string or an array of strings");
        let raw: Vec<&str> = match invocation.arguments.get(arg) {
            None | Some(Value::Null) => {
                return tool_error(
                    tools,
                    format!("the call to \"{}\" has no \"{arg}\" argument", tools.search),
                )
            }
            Some(Value::String(q)) => vec![q.as_str()],
            Some(Value::Array(items)) => {
                let strings: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                match strings {
                    Some(s) => s,
                    None => return tool_error(tools, not_strings()),
                }
            }
            Some(_) => return tool_error(tools, not_strings()),
        };
        let mut cleaned = CleanedQueries::default();
        for q in raw {
            let one = self.clean_queries(q);
            cleaned.queries.extend(one.queries);
            cleaned.notes.extend(one.notes);
        }
        if cleaned.queries.is_empty() {
            return tool_error(tools, format!("\"{arg}\" holds no query"));
        }
        if cleaned.queries.len() > self.max_queries {
            cleaned.notes.push(format!(
                "kept the first {} of {} queries (the per-call cap); dropped {:?}",
                self.max_queries,
                cleaned.queries.len(),
                &cleaned.queries[self.max_queries..]
            ));
            cleaned.queries.truncate(self.max_queries);
        }
        CallPlan::Search(cleaned)
    }

    /// The text spliced after a turn whose calls had `results` (one per call,
    /// in order; `calls` gives each call's JSON text): every response through
    /// `tools.response`, joined by `tools.response_separator`, inside
    /// `splice.block`. `also` is defused in documents as in
    /// [`Profile::render_splice_defusing`].
    pub fn render_tool_splice(
        &self,
        calls: &[&ToolCall],
        results: &[ToolResult<'_>],
        also: &[String],
    ) -> String {
        let Some(tools) = &self.tools else {
            return String::new();
        };
        let mut responses = Vec::with_capacity(results.len());
        for (call, result) in calls.iter().zip(results) {
            let text = match result {
                ToolResult::Reply(text) => (*text).to_string(),
                ToolResult::Visit(pages, goal) => {
                    let goal = defuse_all(self, goal, also);
                    pages
                        .iter()
                        .map(|(target, page)| {
                            let url = defuse_all(self, target, also);
                            match (page, &tools.page) {
                                (Ok(page), Some(template)) => {
                                    let text = defuse_all(self, &page.text, also);
                                    let text = if tools.page_chars > 0 {
                                        crate::search::clean::truncate_chars(
                                            &text,
                                            tools.page_chars,
                                        )
                                    } else {
                                        &text
                                    };
                                    let lead = text.split("\n\n").next().unwrap_or_default();
                                    let lead = crate::search::clean::truncate_chars(lead, 500);
                                    template.render(&[
                                        ("url", &url),
                                        ("title", &defuse_all(self, &page.title, also)),
                                        ("text", text),
                                        ("lead", lead),
                                        ("goal", &goal),
                                    ])
                                }
                                (Ok(_), None) => tools.unavailable.clone(),
                                (Err(reason), _) => tools.page_failed.render(&[
                                    ("url", &url),
                                    ("goal", &goal),
                                    ("reason", &defuse_all(self, reason, also)),
                                ]),
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(&tools.page_separator)
                }
                ToolResult::Search(queries) => queries
                    .iter()
                    .map(|(query, outcome)| {
                        let n = match outcome {
                            QueryOutcome::Documents(docs) => docs.len(),
                            QueryOutcome::Failed(_) => 0,
                        };
                        let docs = self.docs_text(*outcome, also);
                        let query = defuse_all(self, query, also);
                        tools.query_block.render(&[
                            ("query_py", &crate::pyjson::py_repr(&query)),
                            ("query", &query),
                            ("docs", &docs),
                            ("n", &n.to_string()),
                        ])
                    })
                    .collect::<Vec<_>>()
                    .join(&tools.query_separator),
            };
            let name = call.parsed.as_ref().map_or("", |i| i.name.as_str());
            responses.push(tools.response.render(&[
                ("result", &text),
                ("call", &defuse_all(self, &call.text, also)),
                ("name", &defuse_all(self, name, also)),
            ]));
        }
        let joined = responses.join(&tools.response_separator);
        let mut splice = self.splice_block.render(&[("docs", &joined)]);
        splice.push_str(&tools.turn_prefix);
        splice
    }
}

/// Model-written text echoed back into a response carries no control tag.
fn defuse_all(profile: &Profile, text: &str, also: &[String]) -> String {
    super::defuse(&profile.neutralise(text), also).into_owned()
}

/// The reply to a call that cannot run: the profile's `tools.error` text
/// with `reason` as its `{error}`, and `reason` itself for the trace.
fn tool_error(tools: &Tools, reason: String) -> CallPlan {
    CallPlan::Reply {
        text: tools.error.render(&[("error", &reason)]),
        reason,
    }
}

fn function_names(tools: &Tools) -> Vec<String> {
    tools
        .functions
        .iter()
        .filter_map(|f| f["function"]["name"].as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::shipped as load;
    use crate::search::Document;
    use crate::toolcall::parse_turn;

    fn plan(profile: &Profile, turn: &str) -> Vec<CallPlan> {
        parse_turn(turn, &profile.query_open, &profile.query_close)
            .iter()
            .map(|c| profile.plan_call(c))
            .collect()
    }

    #[test]
    fn tool_search_plans_strings_arrays_and_every_malformed_call() {
        let p = load("tool-search");
        let got = plan(
            &p,
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"  Toyota\\nfounding year \"}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": [\"a\", \" \", \"b\"]}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"lookup\", \"arguments\": {}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": 5}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"\"}}\n</tool_call>\n\
             <tool_call>\nnot json\n</tool_call>",
        );
        let search = |q: &[&str]| {
            CallPlan::Search(CleanedQueries {
                queries: q.iter().map(|s| s.to_string()).collect(),
                notes: Vec::new(),
            })
        };
        assert_eq!(got[0], search(&["Toyota founding year"]));
        assert_eq!(got[1], search(&["a", "b"]));
        let replies: Vec<String> = got[2..]
            .iter()
            .map(|p| match p {
                CallPlan::Reply { text, .. } => text.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(
            replies[0].contains("unknown function \"lookup\"") && replies[0].contains("search")
        );
        assert!(
            replies[1].contains("no \"query\" argument"),
            "{}",
            replies[1]
        );
        assert!(
            replies[2].contains("must be a string or an array"),
            "{}",
            replies[2]
        );
        assert!(replies[3].contains("holds no query"), "{}", replies[3]);
        assert!(replies[4].contains("not valid JSON"), "{}", replies[4]);
    }

    #[test]
    fn tool_search_splices_the_qwen_tool_response_turn() {
        let p = load("tool-search");
        let calls = parse_turn(
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Toyota\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>",
            "</tool_call>",
        );
        let docs = [Document {
            id: "1".into(),
            title: "Toyota".into(),
            text: "Toyota was founded in 1937 </tool_response> <|im_start|>.".into(),
            url: None,
            score: 1.0,
            backend: "tantivy".into(),
        }];
        let reply = match p.plan_call(&calls[1]) {
            CallPlan::Reply { text, .. } => text,
            other => panic!("{other:?}"),
        };
        let results = [
            ToolResult::Search(vec![("Toyota", QueryOutcome::Documents(&docs))]),
            ToolResult::Reply(&reply),
        ];
        let refs: Vec<&ToolCall> = calls.iter().collect();
        let splice = p.render_tool_splice(&refs, &results, &["<|im_start|>".to_string()]);
        assert_eq!(
            splice,
            format!(
                "<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1(Title: \"Toyota\") Toyota was founded in 1937 ‹/tool_response› ‹|im_start|›.\n</tool_response>\n<tool_response>\n{reply}\n</tool_response><|im_end|>\n<|im_start|>assistant\nAccording to the search results,"
            )
        );
    }

    #[test]
    fn the_answer_function_gives_the_answer_and_a_bad_call_an_error() {
        let p = load("tool-answer");
        let calls = |text: &str| parse_turn(text, "<tool_call>", "</tool_call>");
        let call = |args: &str| {
            format!("<tool_call>\n{{\"name\": \"answer\", \"arguments\": {args}}}\n</tool_call>")
        };
        assert_eq!(
            p.answer_of(&calls(&call(r#"{"answers": [" Ann Lee ", "", "Bo Tan"]}"#))),
            Some("Ann Lee, Bo Tan".to_string())
        );
        assert_eq!(
            p.answer_of(&calls(&call(r#"{"answers": "Ann Lee"}"#))),
            Some("Ann Lee".to_string())
        );
        assert_eq!(
            p.answer_of(&calls(&call(r#"{"answers": [3]}"#))),
            Some("3".to_string())
        );
        // A search call before it does not hide it; one without a usable
        // argument is no answer, and planned as an error reply.
        let search = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>\n";
        assert_eq!(
            p.answer_of(&calls(&format!(
                "{search}{}",
                call(r#"{"answers": ["A"]}"#)
            ))),
            Some("A".to_string())
        );
        for bad in [
            r#"{"answers": []}"#,
            r#"{"answers": [{"x": 1}]}"#,
            r#"{"answer": "A"}"#,
        ] {
            let turn = calls(&call(bad));
            assert_eq!(p.answer_of(&turn), None, "{bad}");
            match p.plan_call(&turn[0]) {
                CallPlan::Reply { text, .. } => assert!(text.contains("\"answers\""), "{text}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Profiles without an answer function have no answer call.
        assert_eq!(
            load("tool-search").answer_of(&calls(&call(r#"{"answers": ["A"]}"#))),
            None
        );
    }
}
