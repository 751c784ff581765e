//! The uids of the network layer's services: each its own, not root, not the agent's, in no
//! image's passwd, so that the rules can tell their packets apart by the socket's owner (`meta
//! skuid`) and nothing of the agent's can pose as one. A service run as one of them has it for its
//! gid too (`AgentPrivileges::system`).

/// The DNS gate's uid in sidecar mode (its sockets are made as it, dns/owned.rs): the one owner the
/// rules let query the upstream resolvers and send from port 53 there.
pub const GATE_UID: u32 = 65531;

/// The key forwarder's own user: not the agent's, not root, not the checker's.
pub const FORWARDER_UID: u32 = 65532;

/// The name checker's uid and gid: not root, not the agent, in no image's passwd.
pub const CHECKER_UID: u32 = 65533;
