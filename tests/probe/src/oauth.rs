//! The providers' sign-in endpoints as the mock serves them (under their real host names, with the
//! test CA): the token refresh of Claude (platform.claude.com, JSON), OpenAI (auth.openai.com,
//! JSON or a form; its tokens are JWTs whose claims Codex and OpenCode read) and Google
//! (oauth2.googleapis.com, a form), and what a CLI asks of the account right after: Claude's
//! profile and roles, Google's token info and user info, Code Assist's set-up. A refresh answers
//! with [`REFRESHED`] as the new access token, so that a test can tell the refreshed token from
//! the expired one on the API requests that follow.

use serde_json::{Value, json};

use crate::answer::Answer;

/// The access token every refresh hands out (in a JWT, its signature), and the refresh token
/// that replaces the one sent.
pub const REFRESHED: &str = "mock-access-refreshed";
pub const ROTATED: &str = "mock-refresh-rotated";

fn ok(body: Value, turn: &'static str) -> Answer {
    Answer {
        status: 200,
        content_type: "application/json",
        body: body.to_string(),
        turn,
        note: String::new(),
    }
}

/// The form or JSON fields of a token request.
fn fields(body: &[u8]) -> std::collections::HashMap<String, String> {
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) {
        return map.into_iter().map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string())).collect();
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(&v.replace('+', " "))))
        .collect()
}

/// `%XX` escapes decoded (a malformed one kept as it is); the form's `+` is the caller's.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex =
            bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// An unsigned JWT (OpenAI's tokens are read for their claims, not verified, by the CLIs) with
/// the ChatGPT claims Codex and OpenCode look for, expiring `exp`; its last part is `signature`.
pub fn openai_jwt(exp: u64, signature: &str) -> String {
    let claims = json!({
        "iss": "https://auth.openai.com",
        "aud": ["app_EMoamEEZ73f0CkXaXp7hrann"],
        "sub": "mock-user",
        "email": "agent@example.com",
        "exp": exp,
        "iat": exp.saturating_sub(3600),
        "chatgpt_account_id": "mock-account",
        "https://api.openai.com/auth": {
            "chatgpt_account_id": "mock-account",
            "chatgpt_plan_type": "plus",
            "chatgpt_user_id": "mock-user",
            "user_id": "mock-user"
        },
        "https://api.openai.com/profile": {"email": "agent@example.com", "email_verified": true}
    });
    format!(
        "{}.{}.{signature}",
        base64url(br#"{"alg":"RS256","typ":"JWT"}"#),
        base64url(claims.to_string().as_bytes())
    )
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The answer to a sign-in request, if `path` is one.
pub fn answer(method: &str, path: &str, body: &[u8]) -> Option<Answer> {
    let route = path.split('?').next().unwrap_or(path);
    let refresh = |fields: &std::collections::HashMap<String, String>| {
        format!(
            "grant={} refresh={}",
            fields.get("grant_type").map_or("-", String::as_str),
            fields.get("refresh_token").map_or("-", String::as_str)
        )
    };
    let mut answer = match (method, route) {
        // Claude (platform.claude.com): JSON in, JSON out; the stored scopes are the answer's.
        ("POST", "/v1/oauth/token") => {
            let fields = fields(body);
            let mut answer = ok(
                json!({
                    "token_type": "Bearer",
                    "access_token": REFRESHED,
                    "refresh_token": ROTATED,
                    "expires_in": 28_800,
                    "scope": "user:inference user:profile user:sessions:claude_code",
                    "account": {"uuid": "mock-account", "email_address": "agent@example.com"},
                    "organization": {"uuid": "mock-organization", "name": "mock"}
                }),
                "refresh",
            );
            answer.note = refresh(&fields);
            answer
        }
        // OpenAI (auth.openai.com): Codex sends JSON, OpenCode a form.
        ("POST", "/oauth/token") => {
            let fields = fields(body);
            let exp = now() + 3600;
            let mut answer = ok(
                json!({
                    "token_type": "Bearer",
                    "id_token": openai_jwt(exp, "mock-id"),
                    "access_token": openai_jwt(exp, REFRESHED),
                    "refresh_token": ROTATED,
                    "expires_in": 3600
                }),
                "refresh",
            );
            answer.note = refresh(&fields);
            answer
        }
        // Google (oauth2.googleapis.com): a form in.
        ("POST", "/token") => {
            let fields = fields(body);
            let mut answer = ok(
                json!({
                    "access_token": REFRESHED,
                    "expires_in": 3599,
                    "token_type": "Bearer",
                    "scope": "https://www.googleapis.com/auth/cloud-platform https://www.googleapis.com/auth/userinfo.email openid"
                }),
                "refresh",
            );
            answer.note = refresh(&fields);
            answer
        }
        ("GET" | "POST", "/tokeninfo") => ok(
            json!({"expires_in": 3599, "scope": "https://www.googleapis.com/auth/cloud-platform", "email": "agent@example.com", "email_verified": "true", "access_type": "offline"}),
            "account",
        ),
        ("GET", "/oauth2/v2/userinfo" | "/oauth2/v3/userinfo") => ok(
            json!({"id": "1", "sub": "1", "email": "agent@example.com", "verified_email": true, "name": "Agent"}),
            "account",
        ),
        // Claude's account, right after a sign-in or a refresh.
        ("GET", "/api/oauth/profile") => ok(
            json!({
                "account": {"uuid": "mock-account", "email": "agent@example.com", "display_name": "Agent", "has_claude_max": true, "has_claude_pro": false},
                "organization": {"uuid": "mock-organization", "name": "mock", "organization_type": "claude_max", "rate_limit_tier": "default_claude_max_20x"}
            }),
            "account",
        ),
        ("GET", "/api/oauth/claude_cli/roles") => ok(
            json!({"organization_role": "admin", "workspace_role": null, "organization_name": "mock"}),
            "account",
        ),
        // ChatGPT's backend (chatgpt.com): Codex starts a ChatGPT sign-in's session only once it
        // finds the token's account here.
        ("GET", "/backend-api/wham/accounts/check") => ok(
            json!({
                "accounts": [{
                    "id": "mock-account", "account_id": "mock-account", "name": "Agent",
                    "structure": "personal", "plan_type": "plus", "role": "owner",
                    "is_default": true, "is_deactivated": false, "can_access_with_session": true,
                    "workspace_backend_origin": "https://chatgpt.com",
                    "account_routing_override": "NO_CONSTRAINT"
                }],
                "default_account_id": "mock-account",
                "current_account_id": "mock-account",
                "account_ordering": ["mock-account"]
            }),
            "account",
        ),
        ("GET", "/backend-api/codex/models") => ok(json!({"models": []}), "account"),
        // Code Assist (cloudcode-pa.googleapis.com), a Google sign-in's API: its set-up.
        ("POST", "/v1internal:loadCodeAssist") => ok(
            json!({
                "currentTier": {"id": "standard-tier", "name": "Gemini Code Assist", "userDefinedCloudaicompanionProject": false},
                "allowedTiers": [{"id": "standard-tier", "isDefault": true, "userDefinedCloudaicompanionProject": false}],
                "cloudaicompanionProject": "mock-project"
            }),
            "account",
        ),
        ("POST", "/v1internal:onboardUser") => ok(
            json!({"done": true, "response": {"cloudaicompanionProject": {"id": "mock-project", "name": "mock-project"}}}),
            "account",
        ),
        _ => return None,
    };
    if answer.note.is_empty() && answer.turn == "refresh" {
        answer.note = "refresh".into();
    }
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_hands_out_the_refreshed_token_and_names_the_one_it_was_sent() {
        let claude = answer(
            "POST",
            "/v1/oauth/token",
            br#"{"grant_type":"refresh_token","refresh_token":"host-refresh","client_id":"c"}"#,
        )
        .unwrap();
        assert!(claude.body.contains(REFRESHED) && claude.body.contains("user:inference"), "{}", claude.body);
        assert_eq!(claude.note, "grant=refresh_token refresh=host-refresh");
        let google =
            answer("POST", "/token", b"refresh_token=1%2F%2Fhost&client_id=x&grant_type=refresh_token")
                .unwrap();
        assert_eq!(google.note, "grant=refresh_token refresh=1//host");
        let openai = answer("POST", "/oauth/token", b"grant_type=refresh_token&refresh_token=rt").unwrap();
        let token: Value = serde_json::from_str(&openai.body).unwrap();
        assert!(token["access_token"].as_str().unwrap().ends_with(&format!(".{REFRESHED}")));
        assert!(answer("POST", "/v1/messages", b"{}").is_none());
    }

    #[test]
    fn a_jwt_is_three_base64url_parts() {
        let jwt = openai_jwt(2_000_000_000, "sig");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert!(
            parts[..2].iter().all(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        );
        assert_eq!(base64url(b"hi"), "aGk");
        assert_eq!(base64url(b"hello"), "aGVsbG8");
    }
}
