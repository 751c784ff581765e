//! What in a model API request makes the provider's own servers contact a URL the request
//! names: Anthropic's MCP connector (`mcp_servers`) and web fetch tool, OpenAI's remote MCP
//! tool, Gemini's URL context, Mistral's connectors (a registered MCP server), and content the
//! provider fetches by its URL (an image, a document or a file given as a link rather than
//! inline). With the user's key, such a request
//! carries whatever the agent put in it to any address, past the allowlist, from the
//! provider's side. The key forwarder refuses such requests unless the policy says
//! `remote_tools: allow` for the API. Pure.
//!
//! The whole request is searched, at any depth, for every API's shapes: a batch nests whole
//! requests (Anthropic's `requests[].params`, Gemini's `batch.input_config`), and a provider
//! may accept another's format (OpenAI-compatible endpoints). A link to the API's own host
//! (a file the provider stores) is not a fetch elsewhere.
//!
//! Web search tools are not among them: the provider searches with the query and fetches what
//! its search found, not an address the request names (the README says what that leaves).

use serde_json::Value;

use sandbox_policy::text::quoted;

/// The keys whose value is content the provider fetches by its link (Anthropic's
/// `{"type": "url", "url": …}` sources are read apart): OpenAI's `image_url` and `file_url`
/// (vLLM's and llama.cpp's `audio_url` and `video_url` too),
/// Mistral's `document_url`, where a provider fetches a connector's sign-in metadata or a
/// document to ingest, Gemini's `fileData.fileUri`.
const LINK_KEYS: &[&str] = &[
    "image_url",
    "audio_url",
    "video_url",
    "file_url",
    "document_url",
    "oauth2_server_metadata_url",
    "signed_url",
    "file_uri",
    "fileUri",
];

/// The other words a fetch is named by: tools, servers, Anthropic's `url` sources.
const TOOL_WORDS: &[&str] = &[
    "mcp_servers",
    "mcp",
    "web_fetch",
    "server_url",
    "connector_id",
    "url_context",
    "urlContext",
    "\"url\"",
    "\"server\"",
];

/// The first word of a fetch in `text`, for a body this module cannot read as JSON: the
/// provider's reader may read it all the same, and such a body naming one is refused.
pub fn fetch_word(text: &str) -> Option<&'static str> {
    LINK_KEYS.iter().chain(TOOL_WORDS).copied().find(|word| text.contains(word))
}

/// The first thing in `body` that makes the provider contact a URL other than on `own_host`
/// (the API's host): what it is, for the refusal. None if there is none.
pub fn named(body: &Value, own_host: &str) -> Option<String> {
    match body {
        Value::Array(items) => items.iter().find_map(|item| named(item, own_host)),
        Value::Object(object) => {
            if let Some(found) = in_object(object, own_host) {
                return Some(found);
            }
            object
                .iter()
                .filter(|(key, _)| !opaque(object, key))
                .find_map(|(_, value)| named(value, own_host))
        }
        _ => None,
    }
}

/// Whether `object`'s value under `key` is data the provider does not act on: a tool's schema
/// (`input_schema`, `parameters`, JSON Schema's `properties`) and a tool call's arguments or
/// result (Anthropic's `tool_use` `input`, OpenAI's `arguments`, Gemini's `functionCall` `args`
/// and `functionResponse` `response`): the agent's own data, which may name `image_url` or
/// `mcp_servers` as plain fields. OpenAI's Responses API's top-level `input` is messages, and
/// searched.
fn opaque(object: &serde_json::Map<String, Value>, key: &str) -> bool {
    let kind = object.get("type").and_then(Value::as_str).unwrap_or_default();
    match key {
        "input" => kind.ends_with("tool_use"),
        "response" => object.contains_key("name"),
        "args"
        | "arguments"
        | "input_schema"
        | "inputSchema"
        | "parameters"
        | "parametersJsonSchema"
        | "properties" => true,
        _ => false,
    }
}

/// What this object itself asks the provider to fetch.
fn in_object(object: &serde_json::Map<String, Value>, own_host: &str) -> Option<String> {
    let kind = |tool: &Value| tool.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    if object.get("mcp_servers").is_some_and(|s| s.as_array().is_some_and(|a| !a.is_empty())) {
        return Some("`mcp_servers` (Anthropic's MCP connector)".into());
    }
    for tool in object.get("tools").and_then(Value::as_array).into_iter().flatten() {
        let k = kind(tool);
        if k.starts_with("web_fetch") || k.starts_with("mcp") {
            return Some(format!("the {} tool (the provider fetches a URL the request names)", quoted(&k)));
        }
        if tool.get("server_url").is_some() || tool.get("connector_id").is_some() {
            return Some("an `mcp` tool (OpenAI's remote MCP servers and connectors)".into());
        }
        if tool.get("url_context").is_some() || tool.get("urlContext").is_some() {
            return Some("the `url_context` tool (the provider fetches the URLs in the prompt)".into());
        }
    }
    // A server the provider registers and contacts: Mistral's connectors (`POST /v1/connectors`
    // with the MCP server's URL in `server`), which its conversations then call.
    if let Some(url) = object.get("server").and_then(Value::as_str)
        && elsewhere(url, own_host)
    {
        return Some(format!("a connector's `server` (the provider contacts {})", quoted(url)));
    }
    // Content given by its link: Anthropic's `{"type": "url", "url": …}` sources, and every
    // key of LINK_KEYS.
    let link = |value: Option<&Value>| -> Option<String> {
        let value = value?;
        let url = value.as_str().or_else(|| value.get("url").and_then(Value::as_str))?;
        elsewhere(url, own_host).then(|| quoted(url))
    };
    let source = (object.get("type").and_then(Value::as_str) == Some("url")).then(|| link(object.get("url")));
    source
        .flatten()
        .or_else(|| LINK_KEYS.iter().find_map(|key| link(object.get(*key))))
        .map(|url| format!("content the provider fetches from {url} (a link, not the content itself)"))
}

/// Whether `url` is a link the provider would fetch from a host other than `own_host`: any
/// scheme but `data:` (content inline) and the provider's own files.
fn elsewhere(url: &str, own_host: &str) -> bool {
    let url = url.trim();
    // A backslash is a slash to browsers' URL parsers: `https://a\\@b/` goes to a.
    if url.contains('\\') {
        return true;
    }
    let Some((scheme, rest)) = url.split_once(':') else {
        // No scheme: `//host/…`, or `host.tld/…`, which a server may complete with https://. A
        // name without a dot (`files/abc`, a region) is not a host.
        let authority = url.trim_start_matches('/').split(['/', '?', '#']).next().unwrap_or_default();
        return (url.starts_with("//") || authority.contains('.'))
            && !authority.eq_ignore_ascii_case(own_host);
    };
    if scheme.eq_ignore_ascii_case("data") {
        return false;
    }
    let authority = rest.trim_start_matches('/').split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default().split(':').next().unwrap_or_default();
    !(scheme.eq_ignore_ascii_case("https") && host.eq_ignore_ascii_case(own_host))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "api.example.com";

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
            // Nested: a batch of whole requests (found by a red team at the top level only).
            (
                "anthropic",
                r#"{"requests":[{"custom_id":"a","params":{"model":"m","mcp_servers":[{"type":"url","url":"https://x.test/sse"}]}}]}"#,
            ),
            (
                "gemini",
                r#"{"batch":{"input_config":{"requests":{"requests":[{"request":{"contents":[],"tools":[{"url_context":{}}]}}]}}}}"#,
            ),
            // Content by its link, which the provider fetches.
            (
                "anthropic",
                r#"{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x.test/a.png?d=1"}}]}]}"#,
            ),
            (
                "anthropic",
                r#"{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"http://x.test/a.pdf"}}]}]}"#,
            ),
            (
                "openai",
                r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x.test/a.png"}}]}]}"#,
            ),
            (
                "openai",
                r#"{"input":[{"content":[{"type":"input_image","image_url":"https://x.test/a.png"}]}]}"#,
            ),
            (
                "openai",
                r#"{"input":[{"content":[{"type":"input_file","file_url":"https://x.test/a.pdf"}]}]}"#,
            ),
            (
                "mistral",
                r#"{"messages":[{"role":"user","content":[{"type":"document_url","document_url":"https://x.test/a.pdf"}]}]}"#,
            ),
            (
                "mistral",
                r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://x.test/a.png"}]}]}"#,
            ),
            // Registering a connector: Mistral's servers contact its MCP server, or its sign-in's
            // metadata (found by a red team).
            (
                "mistral",
                r#"{"name":"x","description":"d","server":"https://x.test/mcp?d=1","visibility":"private"}"#,
            ),
            (
                "mistral",
                r#"{"name":"x","server":"https://api.example.com/mcp","oauth2_server_metadata_url":"https://x.test/?d=1"}"#,
            ),
            ("mistral", r#"{"filename":"a.pdf","signed_url":"https://x.test/?d=1"}"#),
            // A link without its scheme, which a server may complete (found by a red team).
            (
                "mistral",
                r#"{"messages":[{"content":[{"type":"document_url","document_url":"x.test/a.pdf"}]}]}"#,
            ),
            ("mistral", r#"{"name":"x","server":"//x.test/mcp"}"#),
            (
                "mistral",
                r#"{"inputs":[{"role":"user","content":[{"type":"document_url","document_url":"https://x.test/a.pdf"}]}]}"#,
            ),
            (
                "gemini",
                r#"{"contents":[{"parts":[{"fileData":{"mimeType":"image/png","fileUri":"https://x.test/a"}}]}]}"#,
            ),
            ("gemini", r#"{"contents":[{"parts":[{"file_data":{"file_uri":"gs://bucket/a"}}]}]}"#),
            // A backslash before `@` (found by a second red team): browsers read the host before it.
            (
                "gemini",
                r#"{"contents":[{"parts":[{"fileData":{"fileUri":"https://x.test\\@api.example.com/x"}}]}]}"#,
            ),
        ] {
            assert!(named(&json(body), HOST).is_some(), "{api}: {body}");
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
            // A `server` that names no URL elsewhere: a region, the API's own host.
            ("mistral", r#"{"model":"m","server":"eu-west","messages":[]}"#),
            ("mistral", r#"{"name":"x","server":"https://api.example.com/v1/mcp"}"#),
            ("gemini", r#"{"contents":[{"parts":[{"fileData":{"fileUri":"files/abc-123"}}]}]}"#),
            ("openai", r#"{"model":"m","tools":[{"type":"function","name":"shell"},{"type":"web_search"}]}"#),
            (
                "gemini",
                r#"{"contents":[{"parts":[{"text":"url_context"}]}],"tools":[{"functionDeclarations":[]},{"google_search":{}}]}"#,
            ),
            ("gemini", r#"{"contents":[]}"#),
            // Content inline, a file the provider stores, and a search result's link.
            (
                "openai",
                r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}"#,
            ),
            (
                "gemini",
                r#"{"contents":[{"parts":[{"fileData":{"fileUri":"https://api.example.com/v1beta/files/x"}}]}]}"#,
            ),
            (
                "anthropic",
                r#"{"messages":[{"role":"assistant","content":[{"type":"web_search_tool_result","content":[{"type":"web_search_result","url":"https://x.test/","title":"t"}]}]}],"tools":[{"type":"function","name":"f","input_schema":{"properties":{"url":{"type":"string"}}}}]}"#,
            ),
            // A tool's schema and a tool call's own arguments (found by a second red team: they
            // were searched, so a local tool with an `image_url` field broke the session).
            (
                "anthropic",
                r#"{"tools":[{"name":"f","input_schema":{"type":"object","properties":{"mcp_servers":{"type":"array"}}}}],"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"image_url":"https://x.test/a.png","mcp_servers":[{"url":"https://x.test"}]}}]}]}"#,
            ),
            (
                "gemini",
                r#"{"contents":[{"parts":[{"functionCall":{"name":"f","args":{"fileUri":"https://x.test/"}}},{"functionResponse":{"name":"f","response":{"image_url":"https://x.test/"}}}]}]}"#,
            ),
        ] {
            assert_eq!(named(&json(body), HOST), None, "{api}: {body}");
        }
    }
}
