//! What the sandbox reads of the agent's bytes, and decides from them: the TLS ClientHello
//! (`tls`), HTTP/1 requests (`http1`: one head parser, one framing rule, one chunked decoder),
//! the name check's readers built on them and its upload budgets' arithmetic (`namecheck`), the
//! key forwarder's decisions on a request (`forwarder`: its head rewritten, its rules, its
//! body's framing and inspection), and the corpus of HTTP/1 samples they are proven on
//! (`corpus`). Pure: no socket, no syscall, no runtime: bytes in, decisions out, so every rule
//! is unit-tested and fuzzed on its own, and sandbox-init keeps the processes and the kernel.

pub mod corpus;
pub mod forwarder;
pub mod http1;
pub mod namecheck;
pub mod tls;
