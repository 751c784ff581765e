//! What in a model API request makes the provider's own servers contact a URL the request
//! names: Anthropic's MCP connector (`mcp_servers`) and web fetch tool, OpenAI's remote MCP
//! tool, Gemini's URL context. With the user's key, such a request carries whatever the agent
//! put in it to any address, past the allowlist, from the provider's side. The key forwarder
//! refuses such requests unless the policy says `remote_tools: allow` for the API. Pure.
//!
//! Web search tools are not among them: the provider searches with the query and fetches what
//! its search found, not an address the request names (the README says what that leaves).

use serde_json::Value;

/// The first tool of `body` that makes the provider contact a URL, for the API named `api`
/// (`anthropic`, `openai`, `gemini`): what it is, for the refusal. None if there is none.
pub fn named(api: &str, body: &Value) -> Option<String> {
    let tools = body.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let kind = |tool: &Value| tool.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    match api {
        "anthropic" => {
            if body
                .get("mcp_servers")
                .is_some_and(|s| !s.is_null() && s.as_array().is_none_or(|a| !a.is_empty()))
            {
                return Some("`mcp_servers` (Anthropic's MCP connector)".into());
            }
            tools
                .iter()
                .map(kind)
                .find(|k| k.starts_with("web_fetch") || k.starts_with("mcp"))
                .map(|k| format!("the `{k}` tool (the provider fetches a URL the request names)"))
        }
        "openai" => tools
            .iter()
            .find(|t| kind(t) == "mcp" || t.get("server_url").is_some() || t.get("connector_id").is_some())
            .map(|_| "an `mcp` tool (OpenAI's remote MCP servers and connectors)".into()),
        "gemini" => tools
            .iter()
            .find(|t| t.get("url_context").is_some() || t.get("urlContext").is_some())
            .map(|_| "the `url_context` tool (the provider fetches the URLs in the prompt)".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn the_tools_that_fetch_a_url_are_named_per_api() {
        for (api, body) in [
            (
                "anthropic",
                r#"{"model":"m","mcp_servers":[{"type":"url","url":"https://x.test/sse"}],"messages":[]}"#,
            ),
            ("anthropic", r#"{"model":"m","tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}"#),
            ("anthropic", r#"{"model":"m","tools":[{"type":"mcp_toolset","mcp_server_name":"x"}]}"#),
            (
                "openai",
                r#"{"model":"m","tools":[{"type":"mcp","server_label":"x","server_url":"https://x.test"}]}"#,
            ),
            ("openai", r#"{"model":"m","tools":[{"type":"mcp","connector_id":"connector_gmail"}]}"#),
            ("gemini", r#"{"contents":[],"tools":[{"url_context":{}}]}"#),
            ("gemini", r#"{"contents":[],"tools":[{"googleSearch":{}},{"urlContext":{}}]}"#),
        ] {
            assert!(named(api, &json(body)).is_some(), "{api}: {body}");
        }
    }

    #[test]
    fn ordinary_requests_and_search_pass() {
        for (api, body) in [
            (
                "anthropic",
                r#"{"model":"m","tools":[{"name":"Bash","input_schema":{}},{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"mcp_servers url_context"}]}"#,
            ),
            ("anthropic", r#"{"model":"m","mcp_servers":[]}"#),
            ("openai", r#"{"model":"m","tools":[{"type":"function","name":"shell"},{"type":"web_search"}]}"#),
            (
                "gemini",
                r#"{"contents":[{"parts":[{"text":"url_context"}]}],"tools":[{"functionDeclarations":[]},{"google_search":{}}]}"#,
            ),
            ("gemini", r#"{"contents":[]}"#),
        ] {
            assert_eq!(named(api, &json(body)), None, "{api}: {body}");
        }
    }
}
