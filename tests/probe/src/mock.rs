//! The mock model API (`serve --mock-api`): enough of the Anthropic Messages API, the OpenAI
//! Responses and Chat Completions APIs and the Gemini API for one headless turn of each agent
//! CLI. The first request of a turn is answered with a tool call that writes [`FILE`] (in the
//! shape of the tool the CLI offered: Claude Code's `Write`, Codex's `exec`, OpenCode's `write`
//! (or its `apply_patch`, which it offers with a ChatGPT sign-in),
//! Qwen's and Gemini's `write_file` (or Mistral Vibe's, which takes `path`), Copilot's `create`, Continue's `Write` (over Chat
//! Completions, with `filepath`); for Aider, which offers none, a reply
//! in its whole-file edit format), the request carrying the tool's result with a final message.
//! Streamed as the CLIs ask (SSE), each request logged by the caller with its credentials and
//! the tools it offered. A sign-in's APIs too: ChatGPT's backend (Codex compresses what it sends
//! there, with zstd) and Code Assist; the sign-in endpoints themselves are oauth.rs's.

use serde_json::{Value, json};

pub use crate::answer::Answer;

/// The file the scripted tool call writes, and what it writes.
pub const FILE: &str = "/workspace/agent-turn.txt";
pub const CONTENT: &str = "written by the mock API's tool call\n";

fn sse(events: &[(Option<&str>, Value)]) -> String {
    events
        .iter()
        .map(|(event, data)| match event {
            Some(event) => format!("event: {event}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect()
}

fn stream(body: String, turn: &'static str) -> Answer {
    Answer { status: 200, content_type: "text/event-stream", body, turn, note: String::new() }
}

/// Every tool name the request offers, wherever the API nests them (`tools[].name`,
/// `tools[].function.name`, Gemini's `functionDeclarations`, Codex's namespaces).
fn tool_names(value: &Value, under_tools: bool, names: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if under_tools && let Some(Value::String(name)) = map.get("name") {
                names.push(name.clone());
            }
            for (key, child) in map {
                let tools = matches!(key.as_str(), "tools" | "functionDeclarations" | "function");
                tool_names(child, tools || (under_tools && key == "function"), names);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| tool_names(item, under_tools, names)),
        _ => {}
    }
}

/// Whether the request carries a tool's result: the turn's second request.
fn has_tool_result(text: &str) -> bool {
    ["\"tool_result\"", "_call_output\"", "\"functionResponse\"", "\"role\":\"tool\""]
        .iter()
        .any(|m| text.contains(m))
}

pub fn answer(method: &str, path: &str, body: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(body).replace(": ", ":");
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut tools = Vec::new();
    tool_names(&request, false, &mut tools);
    let offers = |name: &str| tools.iter().any(|t| t == name);
    let done = has_tool_result(&text);
    let route = path.split('?').next().unwrap_or(path);
    let mut answer = match (method, route) {
        ("POST", "/v1/messages") => anthropic(done, offers("Write")),
        // Codex asks for a websocket first: 426 sends it to plain HTTP at once.
        ("GET", "/v1/responses" | "/backend-api/codex/responses") => {
            Answer { status: 426, content_type: "text/plain", body: String::new(), turn: "upgrade", note: String::new() }
        }
        // A ChatGPT sign-in's requests go to ChatGPT's backend, in the Responses API's shape.
        ("POST", "/v1/responses" | "/backend-api/codex/responses") => {
            responses(done, offers("write"), offers("exec"), offers("apply_patch"), offers("exec_command"))
        }
        ("POST", "/v1/chat/completions") => {
            let streamed = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
            chat(done, &tools, streamed, &required(&request, "write_file"))
        }
        ("POST", p) if p.starts_with("/v1beta/models/") && p.ends_with(":streamGenerateContent") => {
            gemini(done, offers("write_file"))
        }
        // Code Assist, a Google sign-in's API: Gemini's request and answer, each wrapped.
        ("POST", "/v1internal:streamGenerateContent") => {
            let mut answer = gemini(done, offers("write_file"));
            answer.body = answer
                .body
                .lines()
                .map(|line| match line.strip_prefix("data: ") {
                    Some(event) => {
                        let event: Value = serde_json::from_str(event).unwrap_or(Value::Null);
                        format!("data: {}", json!({"response": event, "traceId": "mock"}))
                    }
                    None => line.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n";
            answer
        }
        ("POST", "/v1internal:countTokens") => Answer {
            status: 200,
            content_type: "application/json",
            body: json!({"totalTokens": 10}).to_string(),
            turn: "count",
            note: String::new(),
        },
        ("POST", p) if p.starts_with("/v1beta/models/") && p.ends_with(":generateContent") => Answer {
            status: 200,
            content_type: "application/json",
            body: json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "{\"complexity_reasoning\":\"simple\",\"complexity_score\":1}"}]}, "finishReason": "STOP", "index": 0}]}).to_string(),
            turn: "classify",
            note: String::new(),
        },
        _ => Answer {
            status: 404,
            content_type: "application/json",
            body: "{}".into(),
            turn: "unknown",
            note: String::new(),
        },
    };
    // What the turn's request offered, for a test to say why the mock answered as it did.
    if matches!(answer.turn, "tool" | "final") {
        let mut offered = tools.clone();
        offered.sort();
        offered.dedup();
        answer.note = format!("tools={}", offered.join(","));
    }
    answer
}

fn anthropic(done: bool, write: bool) -> Answer {
    let start = json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message", "role": "assistant", "model": "mock", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}});
    let (block, delta, stop, turn) = if !done && write {
        let input = json!({"file_path": FILE, "content": CONTENT}).to_string();
        (
            json!({"type": "tool_use", "id": "toolu_mock", "name": "Write", "input": {}}),
            json!({"type": "input_json_delta", "partial_json": input}),
            "tool_use",
            "tool",
        )
    } else {
        (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": "Done."}),
            "end_turn",
            "final",
        )
    };
    stream(
        sse(&[
            (Some("message_start"), start),
            (
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": block}),
            ),
            (Some("content_block_delta"), json!({"type": "content_block_delta", "index": 0, "delta": delta})),
            (Some("content_block_stop"), json!({"type": "content_block_stop", "index": 0})),
            (
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
            ),
            (Some("message_stop"), json!({"type": "message_stop"})),
        ]),
        turn,
    )
}

fn responses(done: bool, write: bool, exec: bool, apply_patch: bool, exec_command: bool) -> Answer {
    let completed = |id: &str| {
        (
            Some("response.completed"),
            json!({"type": "response.completed", "response": {"id": id, "status": "completed", "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}}),
        )
    };
    let patch = format!("*** Begin Patch\n*** Add File: {FILE}\n+{}\n*** End Patch\n", CONTENT.trim_end());
    if !done && (write || exec || apply_patch || exec_command) {
        let item = if write {
            json!({"type": "function_call", "id": "fc_mock", "call_id": "call_mock", "name": "write", "arguments": json!({"filePath": FILE, "content": CONTENT}).to_string(), "status": "completed"})
        } else if exec {
            let input =
                format!("const r = await tools.apply_patch({});\ntext(JSON.stringify(r));", json!(patch));
            json!({"type": "custom_tool_call", "id": "ctc_mock", "status": "completed", "call_id": "call_mock", "name": "exec", "input": input})
        } else if !apply_patch {
            // Codex with a provider it has no model family for (a model server of the user's)
            // offers a shell command, `exec_command`, and no `exec`: the file by printf.
            let text = CONTENT.trim_end().replace('\'', "'\\''");
            let cmd = format!("printf '%s\\n' '{text}' > {FILE}");
            json!({"type": "function_call", "id": "fc_mock", "call_id": "call_mock", "name": "exec_command", "arguments": json!({"cmd": cmd}).to_string(), "status": "completed"})
        } else {
            // OpenCode with a ChatGPT sign-in offers its patch tool in place of `write`.
            json!({"type": "function_call", "id": "fc_mock", "call_id": "call_mock", "name": "apply_patch", "arguments": json!({"patchText": patch}).to_string(), "status": "completed"})
        };
        return stream(
            sse(&[
                (
                    Some("response.output_item.added"),
                    json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
                ),
                (
                    Some("response.output_item.done"),
                    json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
                ),
                completed("resp_mock_1"),
            ]),
            "tool",
        );
    }
    let added = json!({"type": "message", "id": "msg_mock", "role": "assistant", "status": "in_progress", "content": []});
    let message = json!({"type": "message", "id": "msg_mock", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "Done.", "annotations": []}]});
    stream(
        sse(&[
            (
                Some("response.output_item.added"),
                json!({"type": "response.output_item.added", "output_index": 0, "item": added}),
            ),
            (
                Some("response.output_text.delta"),
                json!({"type": "response.output_text.delta", "item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": "Done."}),
            ),
            (
                Some("response.output_item.done"),
                json!({"type": "response.output_item.done", "output_index": 0, "item": message}),
            ),
            completed("resp_mock_2"),
        ]),
        "final",
    )
}

/// The parameters the request's tool `name` declares required (its JSON Schema's `required`,
/// under `parameters`, `input_schema` or `parametersJsonSchema`), wherever the API nests it.
fn required(value: &Value, name: &str) -> Vec<String> {
    match value {
        Value::Object(map) => {
            if map.get("name").and_then(Value::as_str) == Some(name) {
                let schema =
                    ["parameters", "input_schema", "parametersJsonSchema"].iter().find_map(|k| map.get(*k));
                if let Some(list) = schema.and_then(|s| s.get("required")).and_then(Value::as_array) {
                    return list.iter().filter_map(Value::as_str).map(str::to_string).collect();
                }
            }
            map.values()
                .map(|child| required(child, name))
                .find(|found| !found.is_empty())
                .unwrap_or_default()
        }
        Value::Array(items) => {
            items.iter().map(|item| required(item, name)).find(|found| !found.is_empty()).unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

fn chat(done: bool, tools: &[String], streamed: bool, write_file_needs: &[String]) -> Answer {
    let call = if done {
        None
    } else if tools.iter().any(|t| t == "write_file") {
        // Qwen's `write_file` takes `file_path`; Mistral Vibe's, `path`: as its schema says.
        let key = if write_file_needs.iter().any(|p| p == "path") { "path" } else { "file_path" };
        Some(("write_file", json!({key: FILE, "content": CONTENT})))
    } else if tools.iter().any(|t| t == "write") {
        // OpenCode's and Kilo's `write` over Chat Completions (a model server of the user's).
        Some(("write", json!({"filePath": FILE, "content": CONTENT})))
    } else if tools.iter().any(|t| t == "create") {
        Some(("create", json!({"path": FILE, "file_text": CONTENT})))
    } else if tools.iter().any(|t| t == "Write") {
        // Continue's CLI (cn) over Chat Completions: its `Write` takes `filepath`.
        Some(("Write", json!({"filepath": FILE, "content": CONTENT})))
    } else {
        None
    };
    // Aider offers no tool: it writes what a reply in its whole-file format names.
    let text = if tools.is_empty() && !done {
        let name = FILE.trim_start_matches("/workspace/");
        format!("{name}\n```\n{}```\n", CONTENT)
    } else {
        "Done.".to_string()
    };
    let turn = if call.is_some() || (tools.is_empty() && !done) { "tool" } else { "final" };
    let base = |choices: Value| json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": "mock", "choices": choices});
    if !streamed {
        let message = match &call {
            Some((name, args)) => {
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_mock", "type": "function", "function": {"name": name, "arguments": args.to_string()}}]})
            }
            None => json!({"role": "assistant", "content": text}),
        };
        let finish = if call.is_some() { "tool_calls" } else { "stop" };
        let body = json!({"id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock", "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        return Answer {
            status: 200,
            content_type: "application/json",
            body: body.to_string(),
            turn,
            note: String::new(),
        };
    }
    let mut events = Vec::new();
    match &call {
        Some((name, args)) => {
            events.push((None, base(json!([{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_mock", "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}, "finish_reason": null}]))));
            events.push((None, base(json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]))));
        }
        None => {
            events.push((None, base(json!([{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": null}]))));
            events.push((None, base(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]))));
        }
    }
    events.push((None, json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": "mock", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})));
    let mut body = sse(&events);
    body.push_str("data: [DONE]\n\n");
    stream(body, turn)
}

fn gemini(done: bool, write: bool) -> Answer {
    let (part, turn) = if !done && write {
        (
            json!({"functionCall": {"name": "write_file", "args": {"file_path": FILE, "content": CONTENT}}}),
            "tool",
        )
    } else {
        (json!({"text": "Done."}), "final")
    };
    let event = json!({"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}});
    stream(sse(&[(None, event)]), turn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_found_where_each_api_nests_them_and_the_second_request_ends_the_turn() {
        let codex = br#"{"input":[{"type":"additional_tools","tools":[{"type":"namespace","name":"functions","tools":[{"type":"custom","name":"exec"}]}]}]}"#;
        let answer = answer("POST", "/v1/responses", codex);
        assert_eq!(answer.turn, "tool");
        assert!(
            answer.body.contains("custom_tool_call") && answer.body.contains("apply_patch"),
            "{}",
            answer.body
        );
        let cn =
            br#"{"stream":true,"tools":[{"type":"function","function":{"name":"Write"}}],"messages":[]}"#;
        let answer = self::answer("POST", "/v1/chat/completions", cn).body;
        assert!(answer.contains("\"Write\"") && answer.contains("filepath"), "{answer}");
        let qwen = br#"{"stream":true,"tools":[{"type":"function","function":{"name":"write_file"}}],"messages":[]}"#;
        assert!(self::answer("POST", "/v1/chat/completions", qwen).body.contains("\"write_file\""));
        let back = br#"{"stream":true,"tools":[{"type":"function","function":{"name":"write_file"}}],"messages":[{"role":"tool","content":"ok"}]}"#;
        assert_eq!(self::answer("POST", "/v1/chat/completions", back).turn, "final");
        let gemini = br#"{"tools":[{"functionDeclarations":[{"name":"write_file"}]}]}"#;
        assert_eq!(
            self::answer("POST", "/v1beta/models/m:streamGenerateContent?alt=sse", gemini).turn,
            "tool"
        );
        let claude = br#"{"tools":[{"name":"Write"}],"messages":[{"role":"user","content":"x"}]}"#;
        assert!(self::answer("POST", "/v1/messages?beta=true", claude).body.contains("\"Write\""));
        let aider = br#"{"stream":true,"messages":[{"role":"user","content":"x"}]}"#;
        assert!(self::answer("POST", "/v1/chat/completions", aider).body.contains("agent-turn.txt\\n```"));
        assert_eq!(self::answer("GET", "/v1/models", b"").status, 404);
    }
}
