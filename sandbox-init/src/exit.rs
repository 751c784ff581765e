//! Exit codes: every way sandbox-init refuses to start the agent has its own, documented here,
//! in README.md, and in `sandbox-init --help`. The codes follow sysexits.h.

/// Why sandbox-init stopped before the agent started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The command line is wrong.
    Usage = 64,
    /// A policy file is invalid (the message names file, line and column).
    PolicyInvalid = 65,
    /// A policy file cannot be read (the baked policy is missing, a drop-in is unreadable), or a
    /// secret file (an API key) cannot.
    PolicyUnreadable = 66,
    /// The network cannot be sandboxed: the container shares the host's network namespace, or
    /// its resolver is on loopback inside the container, where the agent could pose as it.
    UnsafeNetwork = 68,
    /// `nft` is not installed in the image.
    NftMissing = 69,
    /// The firewall read back from the kernel, or the blocked-connection probe, did not hold.
    VerificationFailed = 70,
    /// A setup step failed: the ruleset was rejected, the DNS gate could not bind, the agent
    /// user is missing, tmux did not start.
    SetupFailed = 71,
    /// Sidecar mode: no gateway said its firewall holds within 60 s, so the agent's container
    /// does not start the session.
    GatewayMissing = 75,
    /// A capability sandbox-init needs is missing: NET_ADMIN on a container with a network (the
    /// firewall), or one of those it starts the agent with (CHOWN, SETUID, SETGID, SETPCAP, KILL).
    MissingCapability = 77,
    /// A setting has an invalid value: SANDBOX_FIREWALL other than on, off or open,
    /// SANDBOX_MAX_ADDRESSES not a number in range, a key's secret file the agent could read,
    /// or a base URL for a held key that is not `https://HOST/PATH`; SANDBOX_ROLE other than
    /// gateway or agent, SANDBOX_DNS not addresses outside the container (or missing for the
    /// gateway), an agent's container that holds a capability or runs as a stranger uid;
    /// SANDBOX_MODEL_SERVER without SANDBOX_MODEL, or in an image that declares no variables for
    /// it, or either not a URL or model name, or the server's address missing, not of the user's
    /// network, or on port 53.
    BadSetting = 78,
}

impl Refusal {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The refusal for a policy that could not be loaded.
    pub fn for_policy(error: &crate::policy::PolicyError) -> Refusal {
        match error {
            crate::policy::PolicyError::Invalid { .. } | crate::policy::PolicyError::Conflict { .. } => {
                Refusal::PolicyInvalid
            }
            crate::policy::PolicyError::Unreadable { .. } => Refusal::PolicyUnreadable,
        }
    }

    pub const ALL: [Refusal; 10] = [
        Refusal::Usage,
        Refusal::PolicyInvalid,
        Refusal::PolicyUnreadable,
        Refusal::UnsafeNetwork,
        Refusal::NftMissing,
        Refusal::VerificationFailed,
        Refusal::SetupFailed,
        Refusal::GatewayMissing,
        Refusal::MissingCapability,
        Refusal::BadSetting,
    ];

    pub fn meaning(self) -> &'static str {
        match self {
            Refusal::Usage => "the command line is wrong",
            Refusal::PolicyInvalid => "a policy file is invalid (file:line:column in the message)",
            Refusal::PolicyUnreadable => "a policy file cannot be read",
            Refusal::UnsafeNetwork => {
                "the network cannot be sandboxed (the host's network, or a resolver the agent could pose as)"
            }
            Refusal::NftMissing => "nft is not installed in the image",
            Refusal::VerificationFailed => "the firewall did not hold when checked",
            Refusal::SetupFailed => "a setup step failed (ruleset, DNS gate, agent user, tmux)",
            Refusal::GatewayMissing => "sidecar mode: no gateway came up in the agent's network namespace",
            Refusal::MissingCapability => {
                "a capability it needs is missing (NET_ADMIN, or one of Docker's defaults)"
            }
            Refusal::BadSetting => {
                "a setting has an invalid value (SANDBOX_*, a secret's mode, an agent's container with capabilities)"
            }
        }
    }
}

/// An error that ends sandbox-init with a refusal code and a one-line message.
#[derive(Debug)]
pub struct Fatal {
    pub refusal: Refusal,
    pub message: String,
}

impl Fatal {
    pub fn new(refusal: Refusal, message: impl std::fmt::Display) -> Fatal {
        Fatal { refusal, message: message.to_string() }
    }
}

/// The exit-code table of `--help`.
pub fn table() -> String {
    let mut text = String::from("  0      the session ended; otherwise the session's own exit status\n");
    for refusal in Refusal::ALL {
        text.push_str(&format!("  {:<6} {}\n", refusal.code(), refusal.meaning()));
    }
    text
}
