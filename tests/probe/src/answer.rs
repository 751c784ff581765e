//! What the mock answers one request with: the API turns (mock.rs) and the sign-in endpoints
//! (oauth.rs) alike.

/// The answer to a request: status, content type, body; and what the turn was, for the log.
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    pub turn: &'static str,
    /// More for the log line (what a sign-in request sent).
    pub note: String,
}
