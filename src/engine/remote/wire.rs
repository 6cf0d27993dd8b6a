//! The wire format of the servers' completions stream: SSE `data:` lines
//! ([`SseLines`]), their JSON chunks ([`parse_chunk`]: text, finish reason,
//! prompt and cached-prompt token counts), and context-overflow errors
//! ([`context_overflow`]). `docs/protocols.md` §6.

use serde_json::Value;

use crate::engine::EngineFinish;

/// `(prompt tokens, context length)` when an error body says the prompt does
/// not fit: llama-server's `exceed_context_size_error` (with `n_prompt_tokens`
/// and `n_ctx`), vLLM's "This model's maximum context length is N tokens.
/// However, you requested M tokens (P in the messages, …)". 0 where the
/// server does not give a number.
pub(super) fn context_overflow(body: &str) -> Option<(usize, usize)> {
    let value: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = if value["error"].is_object() {
        &value["error"]
    } else {
        &value
    };
    if error["type"] == "exceed_context_size_error" {
        let n = |k: &str| error[k].as_u64().unwrap_or(0) as usize;
        return Some((n("n_prompt_tokens"), n("n_ctx")));
    }
    let message = error["message"].as_str().unwrap_or(body);
    let number = |pattern: &str| {
        regex::Regex::new(pattern)
            .expect("valid regex")
            .captures(message)
            .and_then(|c| c[1].parse::<usize>().ok())
    };
    let limit = number(r"maximum context length is (\d+)")?;
    let prompt = number(r"(\d+) (?:tokens )?in the (?:messages|prompt)")
        .or_else(|| number(r"requested (\d+) tokens"))
        .unwrap_or(limit);
    Some((prompt, limit))
}

/// One parsed `data:` payload of a completions stream.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Chunk {
    pub(super) text: String,
    pub(super) finish: Option<EngineFinish>,
    /// Prompt tokens and cached prompt tokens, when reported.
    pub(super) prompt: Option<(usize, Option<usize>)>,
    /// Completion tokens so far, when reported.
    pub(super) generated: Option<usize>,
    /// The ids of the tokens this chunk's text came from, when the server
    /// says: vLLM's `choices[0].token_ids` (`return_token_ids`), else
    /// llama-server's `choices[0].logprobs.content[].id` (`logprobs`).
    /// Empty otherwise.
    pub(super) ids: Vec<u32>,
    /// The stop string that ended the round, where the server names it:
    /// vLLM's `choices[0].stop_reason`, SGLang's `choices[0].matched_stop`
    /// (both also hold a token id after a stop token: not a string, so
    /// `None`). llama-server's OpenAI-style stream does not say.
    pub(super) matched_stop: Option<String>,
}

/// Parses one `data:` payload (`[DONE]` excluded).
pub(super) fn parse_chunk(data: &str) -> Result<Chunk, String> {
    let v: Value = serde_json::from_str(data).map_err(|e| format!("malformed chunk: {e}"))?;
    if v.get("error").is_some() {
        return Err(format!("error event: {}", v["error"]));
    }
    let choice = &v["choices"][0];
    let mut chunk = Chunk {
        text: choice["text"].as_str().unwrap_or("").to_string(),
        finish: match choice["finish_reason"].as_str() {
            None => None,
            Some("length") => Some(EngineFinish::Length),
            Some(_) => Some(EngineFinish::Stop),
        },
        matched_stop: choice["stop_reason"]
            .as_str()
            .or_else(|| choice["matched_stop"].as_str())
            .map(str::to_string),
        ..Chunk::default()
    };
    let id = |t: &Value| t.as_u64().and_then(|t| u32::try_from(t).ok());
    chunk.ids = match choice["token_ids"].as_array() {
        Some(ids) => ids.iter().map_while(id).collect(),
        None => choice["logprobs"]["content"]
            .as_array()
            .map(|tokens| tokens.iter().map_while(|t| id(&t["id"])).collect())
            .unwrap_or_default(),
    };
    if !v["choices"].is_array() && v.get("usage").is_none() {
        return Err("malformed chunk: no choices".into());
    }
    let usage = &v["usage"];
    let timings = &v["timings"];
    if let Some(prompt) = usage["prompt_tokens"].as_u64() {
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .or_else(|| timings["cache_n"].as_u64());
        chunk.prompt = Some((prompt as usize, cached.map(|c| c as usize)));
        chunk.generated = usage["completion_tokens"].as_u64().map(|n| n as usize);
    } else if let (Some(prefilled), Some(cached)) =
        (timings["prompt_n"].as_u64(), timings["cache_n"].as_u64())
    {
        chunk.prompt = Some(((prefilled + cached) as usize, Some(cached as usize)));
        chunk.generated = timings["predicted_n"].as_u64().map(|n| n as usize);
    }
    Ok(chunk)
}

/// Splits an SSE byte stream into `data:` payloads.
#[derive(Default)]
pub(super) struct SseLines {
    buffer: Vec<u8>,
}

impl SseLines {
    /// The complete `data:` payloads in `bytes` (plus what was held back).
    pub(super) fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = std::str::from_utf8(&line)
                .map_err(|_| "malformed stream: not UTF-8".to_string())?
                .trim_end_matches(['\r', '\n']);
            if let Some(data) = line.strip_prefix("data:") {
                out.push(data.strip_prefix(' ').unwrap_or(data).to_string());
            }
            // Comments (`: ping`), `event:`/`id:` lines and blank lines are
            // not data.
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_lines_split_across_reads_and_skip_comments() {
        let mut lines = SseLines::default();
        assert_eq!(lines.push(b"data: {\"a\"").unwrap(), Vec::<String>::new());
        assert_eq!(
            lines.push(b":1}\n\n: ping\r\ndata:[DONE]\r\n").unwrap(),
            vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]
        );
    }

    #[test]
    fn chunks_of_llama_server_and_vllm_are_read() {
        // llama-server with timings_per_token.
        let c = parse_chunk(r#"{"choices":[{"text":" Leo","finish_reason":null}],"timings":{"cache_n":20,"prompt_n":3,"predicted_n":1}}"#).unwrap();
        assert_eq!(c.text, " Leo");
        assert_eq!(c.prompt, Some((23, Some(20))));
        assert_eq!(c.generated, Some(1));
        assert!(c.ids.is_empty());
        // The generated ids: llama-server's logprobs, vLLM's token_ids.
        let c = parse_chunk(r#"{"choices":[{"text":"<think","logprobs":{"content":[{"id":27,"token":"<","logprob":-0.1},{"id":26865,"token":"think","logprob":-0.2}]},"finish_reason":null}]}"#).unwrap();
        assert_eq!(c.ids, [27, 26865]);
        let c = parse_chunk(r#"{"choices":[{"text":"<think","token_ids":[27,26865],"logprobs":null,"finish_reason":null}]}"#).unwrap();
        assert_eq!(c.ids, [27, 26865]);
        // The stop string the server matched: vLLM's stop_reason, SGLang's
        // matched_stop; a stop token's id is no string.
        let c = parse_chunk(
            r#"{"choices":[{"text":"","finish_reason":"stop","stop_reason":"</search>"}]}"#,
        )
        .unwrap();
        assert_eq!(c.matched_stop.as_deref(), Some("</search>"));
        let c = parse_chunk(
            r#"{"choices":[{"text":"","finish_reason":"stop","matched_stop":"</answer>"}]}"#,
        )
        .unwrap();
        assert_eq!(c.matched_stop.as_deref(), Some("</answer>"));
        let c = parse_chunk(
            r#"{"choices":[{"text":"","finish_reason":"stop","matched_stop":151645}]}"#,
        )
        .unwrap();
        assert_eq!(c.matched_stop, None);
        // vLLM with continuous usage stats.
        let c = parse_chunk(r#"{"choices":[{"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":40,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":32}}}"#).unwrap();
        assert_eq!(c.finish, Some(EngineFinish::Length));
        assert_eq!(c.prompt, Some((40, Some(32))));
        assert_eq!(c.generated, Some(7));
        // The usage-only chunk of include_usage.
        let c = parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#)
            .unwrap();
        assert_eq!(c.prompt, Some((5, None)));
        assert!(parse_chunk("{not json").is_err());
        assert!(parse_chunk(r#"{"error":{"message":"boom"}}"#).is_err());
        assert!(parse_chunk(r#"{"id":"x"}"#).is_err());
    }

    #[test]
    fn context_errors_of_both_servers_are_recognised() {
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        assert_eq!(context_overflow(llama), Some((5000, 4096)));
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the messages, 100 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","code":400}"#;
        assert_eq!(context_overflow(vllm), Some((2000, 2048)));
        assert_eq!(
            context_overflow(r#"{"error":{"message":"model not found"}}"#),
            None
        );
    }
}
