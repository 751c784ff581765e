//! `agent-sandbox policy check`: whether a policy lets the agent make each request, and why,
//! without sending anything. The policy is a running sandbox's (read out of it as `allow` reads
//! it), with --policy files added, or the files alone. Each target is judged as the sandbox
//! judges it, by the same code: the allowlist the DNS gate answers from
//! (`sandbox_policy::Allowlist`), the ranges that open addresses (`Policy::cidr_allows`), and for
//! a host the forwarder alone reaches, the forwarder's own head parser, rewrite and rules
//! (`sandbox_wire::forwarder`).

use std::net::IpAddr;
use std::path::Path;

use serde::Serialize;

use sandbox_policy::{Allowlist, DomainPattern, Policy, Protocol, address};
use sandbox_wire::forwarder::request::{Route, rewrite_head};
use sandbox_wire::forwarder::rules::{Rules, Verdict};

use crate::exit::{Code, Failure, Result};
use crate::flags::PolicyCheckFlags;

/// What one target asks for: a request (`METHOD URL`) or a bare connection (`HOST:PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// As the user wrote it.
    pub text: String,
    /// None for a bare connection.
    pub method: Option<String>,
    /// A name, lower case, punycode, without a trailing dot; or an address.
    pub host: Host,
    pub port: u16,
    pub https: bool,
    /// The request target: path and query.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Addr(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Addr(addr) => write!(f, "{addr}"),
        }
    }
}

/// The answer for one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub target: String,
    pub allowed: bool,
    /// Why: the entry, the range or the forwarder's rule that decides.
    pub reason: String,
    /// What would change the answer, when it is a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
    /// Decided by the forwarder of the host (which a name check turned off lets the agent pass).
    #[serde(skip)]
    pub by_forwarder: bool,
}

/// The targets of the command line: `URL`, `METHOD URL` (as one argument or two) or `HOST:PORT`.
pub fn targets(words: &[String], bare: bool) -> std::result::Result<Vec<Target>, String> {
    let mut out = Vec::new();
    let mut method: Option<String> = None;
    for word in words {
        let (m, rest) = match word.split_once(' ') {
            Some((m, rest)) if is_method(m) => (Some(m.to_string()), rest.trim()),
            _ => (None, word.as_str()),
        };
        if m.is_none() && is_method(rest) {
            if let Some(previous) = method.replace(rest.to_string()) {
                return Err(format!("the method {previous} is followed by another, {rest}, not a URL"));
            }
            continue;
        }
        let method = m.or_else(|| method.take());
        let mut target = parse(rest, method, bare)?;
        target.text = word.clone();
        out.push(target);
    }
    if let Some(method) = method {
        return Err(format!("the method {method} is not followed by a URL"));
    }
    Ok(out)
}

/// An HTTP method as a command line names one: upper-case letters.
fn is_method(word: &str) -> bool {
    !word.is_empty() && word.len() <= 16 && word.bytes().all(|b| b.is_ascii_uppercase())
}

/// One target: `http(s)://HOST[:PORT]/PATH?QUERY` (GET unless `method`), or `HOST:PORT`; with
/// `bare`, a name alone too, as `NAME:443`.
pub fn parse(text: &str, method: Option<String>, bare: bool) -> std::result::Result<Target, String> {
    let bad =
        |why: &str| format!("{text}: {why}: a target is a URL (https://docs.rs/), `POST URL`, or HOST:PORT");
    if text.contains("://") {
        let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
        let https = match url.scheme() {
            "https" => true,
            "http" => false,
            other => return Err(bad(&format!("the scheme {other} is not HTTP's"))),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("a URL with a user name or password"));
        }
        let host = match url.host() {
            Some(url::Host::Domain(name)) => Host::Name(name.strip_suffix('.').unwrap_or(name).to_string()),
            Some(url::Host::Ipv4(addr)) => Host::Addr(addr.into()),
            Some(url::Host::Ipv6(addr)) => Host::Addr(addr.into()),
            None => return Err(bad("no host")),
        };
        let port = url.port_or_known_default().unwrap_or(if https { 443 } else { 80 });
        // The path as written, not as the URL parser normalises it (`%2e%2e` removed): the
        // agent sends what it likes, and the forwarder judges the bytes it gets.
        let rest = &text[text.find("://").map_or(0, |at| at + 3)..];
        let path = rest.find(['/', '?']).map_or("/".to_string(), |at| match &rest[at..] {
            query if query.starts_with('?') => format!("/{query}"),
            path => path.to_string(),
        });
        let path = path.split_once('#').map_or(path.clone(), |(before, _)| before.to_string());
        let method = Some(method.unwrap_or_else(|| "GET".into()));
        return Ok(Target { text: text.into(), method, host, port, https, path });
    }
    if method.is_some() {
        return Err(bad("a method needs a URL"));
    }
    let (host, port) = match text.rsplit_once(':') {
        Some(split) => split,
        None if bare => (text, "443"),
        None => return Err(bad("no port")),
    };
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(|| bad("the port is not 1 to 65535"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let host = match host.parse::<IpAddr>() {
        Ok(addr) => Host::Addr(addr),
        // The URL parser's host rules (IDNA to punycode, lower case), as for a URL.
        Err(_) => {
            match url::Url::parse(&format!("tcp://{host}/")).map(|u| u.host_str().map(str::to_string)) {
                Ok(Some(name)) if !name.is_empty() => {
                    Host::Name(name.strip_suffix('.').unwrap_or(&name).to_string())
                }
                _ => return Err(bad("not a host name")),
            }
        }
    };
    Ok(Target { text: text.into(), method: None, host, port, https: false, path: String::new() })
}

/// Whether `policy` lets the agent make `target`, and why. `sandbox`: the sandbox's name, for
/// the command that would allow what is refused. `body`: the request's body, for the forwarder
/// rules that read it (GraphQL mutations, LFS batches).
pub fn judge(policy: &Policy, target: &Target, sandbox: Option<&str>, body: Option<&[u8]>) -> Answer {
    let answer = |allowed, reason: String, change: Option<String>| Answer {
        target: target.text.clone(),
        allowed,
        reason,
        change,
        by_forwarder: false,
    };
    let port = target.port;
    let name = match &target.host {
        Host::Addr(addr) => return judge_address(policy, target, *addr),
        Host::Name(name) => name,
    };
    let allow = |entry: String| match sandbox {
        Some(sandbox) => format!("agent-sandbox allow {sandbox} {entry}"),
        None => format!("{entry} in a policy file's `domains:`"),
    };
    if name.ends_with('.') || !matches!(DomainPattern::parse(name), Ok(DomainPattern::Exact(_))) {
        return answer(false, format!("{name} is not a host name the DNS gate answers"), None);
    }
    let answer =
        |allowed, reason: String, change| past_ranges(policy, target, answer(allowed, reason, change));
    let allowlist = Allowlist::new(policy);
    let Some(matched) = allowlist.matches(name) else {
        return answer(
            false,
            format!(
                "{name} is not in the policy: the DNS gate refuses it and the firewall opens nothing for it"
            ),
            Some(allow(if port == 443 { name.clone() } else { format!("{name}:{port}") })),
        );
    };
    let entries: Vec<String> = matched.patterns.iter().map(ToString::to_string).collect();
    let by = format!("the entr{} {}", if entries.len() == 1 { "y" } else { "ies" }, entries.join(", "));
    if !matched.access.allows(Protocol::Tcp, port) {
        let forwarded = allowlist.is_forwarded(name);
        return answer(
            false,
            format!(
                "{by} open{} {name} on {}, not on TCP port {port}{}",
                if entries.len() == 1 { "s" } else { "" },
                matched.access,
                if forwarded { " (the forwarder alone reaches it, on 443)" } else { "" }
            ),
            (!forwarded).then(|| allow(format!("{name}:{port}"))),
        );
    }
    let answers = if matched.access.private {
        "public addresses and the user's network's"
    } else {
        "public addresses only (not the user's network, this host's or a metadata service's)"
    };
    let Some(host) = policy.forwarded().into_iter().find(|h| &h.host == name) else {
        let verb = if entries.len() == 1 { "opens" } else { "open" };
        let mut reason = format!("{by} {verb} it ({}); its DNS answers open {answers}", matched.access);
        if let Some(api) = sandbox_policy::apis::APIS.iter().find(|a| a.host == name) {
            reason.push_str(&format!(
                ". While the sandbox holds the {} key (it does when started with one), the forwarder alone \
                 reaches {name}, on 443, with the API's own requests: the agent's own connections are refused",
                api.name
            ));
        }
        return answer(true, reason, None);
    };
    let answer = |allowed, reason, change| Answer { by_forwarder: true, ..answer(allowed, reason, change) };
    let Some(method) = target.method.as_deref() else {
        return answer(
            true,
            format!(
                "through the forwarder of {}, which judges each HTTPS request by its rules",
                host.service
            ),
            None,
        );
    };
    if !target.https {
        return answer(
            false,
            format!("the forwarder of {} takes HTTPS alone, on port 443", host.service),
            Some(format!("https://{name}{}", target.path)),
        );
    }
    let rules = Rules::for_host(&host);
    match forwarded(&rules, name, method, &target.path, body) {
        Ok(None) => answer(
            true,
            format!("the forwarder of {} lets `{method} {}` through", host.service, target.path),
            None,
        ),
        Ok(Some(reads)) => answer(
            false,
            format!(
                "the forwarder of {} reads the body of `{method} {}` before it decides ({reads}): give it with --body FILE",
                host.service, target.path
            ),
            None,
        ),
        Err(why) => answer(
            false,
            format!("the forwarder of {} refuses it: {why}", host.service),
            // Its reason says what would allow it, where a policy can (docs/forwarding.md).
            None,
        ),
    }
}

/// A name refused on a port a range of the policy opens: a range opens its addresses on the
/// address alone, whatever the name and past the forwarder. A range of every address allows it;
/// any other is said.
fn past_ranges(policy: &Policy, target: &Target, mut answer: Answer) -> Answer {
    if answer.allowed {
        return answer;
    }
    let ranges: Vec<String> = policy
        .cidrs
        .iter()
        .filter(|(_, ports)| ports.contains(&target.port))
        .map(|(net, _)| net.to_string())
        .collect();
    if ranges.is_empty() {
        return answer;
    }
    if policy.cidrs.iter().any(|(net, ports)| net.prefix_len() == 0 && ports.contains(&target.port)) {
        answer.allowed = true;
        answer.change = None;
    }
    answer.reason = format!(
        "{}; but the range{} {} open{} port {} on the address alone, whatever the name and past any \
         forwarder: where {}'s address is in one, the agent reaches it there",
        answer.reason,
        if ranges.len() == 1 { "" } else { "s" },
        ranges.join(", "),
        if ranges.len() == 1 { "s" } else { "" },
        target.port,
        target.host
    );
    answer
}

/// What a running sandbox runs with beyond its policy, which changes every answer: its
/// firewall's mode (`SANDBOX_FIREWALL`), its name check (`SANDBOX_NAME_CHECK`), no network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// `on`, `off` or `open`, as PID 1's status file says.
    pub firewall: String,
    pub name_check: bool,
    pub offline: bool,
}

/// What `sandbox` runs with: the firewall's mode as its status file says it, the name check as
/// PID 1's own environment says it, and whether it has a network.
pub async fn running(sandbox: &crate::engine::Sandbox) -> Result<Running> {
    let firewall = crate::approve::firewall_mode(sandbox).await?;
    let environ = sandbox.exec(&["cat", "/proc/1/environ"]).await?.stdout;
    let name_check = !environ.split('\0').any(|v| v == "SANDBOX_NAME_CHECK=off");
    let offline = sandbox.details().await?.network_mode.as_deref() == Some("none");
    Ok(Running { firewall, name_check, offline })
}

impl Running {
    /// `answer`, the policy's, as the sandbox running so gives it.
    pub fn over(&self, target: &Target, mut answer: Answer) -> Answer {
        let loopback = matches!(target.host, Host::Addr(addr) if addr.to_canonical().is_loopback());
        if self.offline && !loopback {
            answer.allowed = false;
            answer.reason = "the sandbox has no network (--offline): nothing leaves it".into();
            answer.change = None;
        } else if self.firewall != "on" {
            answer.allowed = true;
            answer.reason = format!(
                "the sandbox runs without its egress firewall (SANDBOX_FIREWALL={}): nothing is filtered. \
                 Its policy would say: {}",
                self.firewall, answer.reason
            );
            answer.change = None;
        } else if !self.name_check && !answer.allowed && answer.by_forwarder {
            answer.allowed = true;
            answer.reason = format!(
                "the sandbox's name check is off (SANDBOX_NAME_CHECK=off): an opened address takes any \
                 name, and the agent reaches this host past its forwarder, with a token of its own. With \
                 the name check: {}",
                answer.reason
            );
            answer.change = None;
        }
        answer
    }
}

/// An address the agent names: its own loopback, or what the policy's ranges open.
fn judge_address(policy: &Policy, target: &Target, addr: IpAddr) -> Answer {
    let (allowed, reason, change) = judge_addr(policy, addr, target.port);
    Answer { target: target.text.clone(), allowed, reason, change, by_forwarder: false }
}

fn judge_addr(policy: &Policy, addr: IpAddr, port: u16) -> (bool, String, Option<String>) {
    let addr = addr.to_canonical();
    // Docker's embedded DNS answers any name: the DNS gate's alone (sandbox-init's firewall).
    if addr == IpAddr::from([127, 0, 0, 11]) {
        return (
            false,
            format!("{addr} is the engine's DNS, which answers any name: the DNS gate's alone"),
            None,
        );
    }
    if addr.is_loopback() {
        return (
            true,
            format!(
                "{addr} is the sandbox's own loopback: it reaches what listens in the sandbox, and nothing outside"
            ),
            None,
        );
    }
    if let Some((net, _)) =
        policy.cidrs.iter().find(|(net, ports)| net.contains(&addr) && ports.contains(&port))
    {
        return (true, format!("the range {net} opens port {port} (TCP and UDP)"), None);
    }
    let scope = address::scope(addr);
    let reason = format!(
        "{addr} is {}, and no range of the policy (`cidrs:`) opens it on port {port}; an address is \
         opened otherwise only by an allowed name's DNS answer",
        scope.describe()
    );
    // A metadata service holds the cloud's credentials: nothing here suggests opening it.
    let change = matches!(scope, address::Scope::Public | address::Scope::Private)
        .then(|| format!("a `cidrs:` entry for {addr} with port {port}, in a policy file"));
    (false, reason, change)
}

/// The forwarder's verdict on a request, by its own parser, rewrite and rules: Ok(None) passes,
/// Ok(Some(what)) needs the body, which was not given.
fn forwarded(
    rules: &Rules,
    host: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> std::result::Result<Option<&'static str>, String> {
    let head = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n\r\n");
    let parsed = sandbox_wire::http1::parse_head(head.as_bytes())
        .map_err(|why| format!("the request does not parse: {why}"))?
        .ok_or("the request does not parse")?;
    let route = Route {
        fd: -1,
        host: host.to_string(),
        header: String::new(),
        value: String::new(),
        strip: Vec::new(),
        path: None,
        inspect: None,
        rules: rules.clone(),
        upstream: None,
    };
    let rewritten = rewrite_head(&parsed, &route).map_err(|r| r.reason().to_string())?;
    let request = rewritten.request();
    match (rules.judge_head(&request).map_err(|r| r.reason().to_string())?, body) {
        (Verdict::Pass, _) => Ok(None),
        (Verdict::Body, Some(body)) => {
            rules.judge_body(&request, body).map(|()| None).map_err(|r| r.reason().to_string())
        }
        (Verdict::Body, None) => Ok(Some(match rules {
            Rules::Github { .. } if path.starts_with("/graphql") => {
                "a GraphQL mutation is judged by its name"
            }
            _ => "an LFS batch is judged by its operation and repository",
        })),
    }
}

pub async fn run(flags: &PolicyCheckFlags) -> Result<i32> {
    let words = &flags.targets;
    // The first word names a sandbox (never a URL, `HOST:PORT` or a method); with --policy
    // files alone, there is none.
    let is_target =
        |w: &str| w.contains("://") || w.contains(':') || is_method(w.split(' ').next().unwrap_or(w));
    let (sandbox, words) = match words.split_first() {
        Some((first, rest)) if !is_target(first) => (Some(first.as_str()), rest),
        _ if flags.policy.is_empty() => {
            return Err(Failure::new(
                Code::BadArgument,
                "name a running sandbox (`agent-sandbox ls`), or give the policy with --policy FILE",
            ));
        }
        _ => (None, &words[..]),
    };
    let targets = targets(words, false).map_err(|e| Failure::new(Code::BadArgument, e))?;
    if targets.is_empty() {
        return Err(Failure::new(
            Code::BadArgument,
            "no target: name URLs (https://docs.rs/, 'POST https://api.github.com/gists') or HOST:PORT",
        ));
    }
    let (mut policy, running) = match sandbox {
        Some(which) => {
            let sandbox = crate::engine::Engine::connect().await?.find(which).await?;
            sandbox.ensure_running()?;
            (crate::approve::policy_in(&sandbox, None).await?, Some(running(&sandbox).await?))
        }
        None => (Policy::default(), None),
    };
    for file in &flags.policy {
        policy.merge(read(file)?);
    }
    let body = match &flags.body {
        Some(file) => Some(std::fs::read(file).map_err(|e| {
            Failure::new(Code::BadArgument, format!("cannot read the body {}: {e}", file.display()))
        })?),
        None => None,
    };
    let answers: Vec<Answer> = targets
        .iter()
        .map(|t| {
            let answer = judge(&policy, t, sandbox, body.as_deref());
            match &running {
                Some(running) => running.over(t, answer),
                None => answer,
            }
        })
        .collect();
    show(&answers, flags.json);
    Ok(if answers.iter().all(|a| a.allowed) { 0 } else { 1 })
}

/// The answers as `policy check` and `why` print them (escaped: names and reasons may be the
/// agent's), or as JSON.
pub fn show(answers: &[Answer], json: bool) {
    if json {
        crate::say::json(&answers);
        return;
    }
    for a in answers {
        let verdict = if a.allowed { "allowed" } else { "refused" };
        let mut text = format!("{verdict}  {}\n         {}\n", a.target, a.reason);
        if let Some(change) = &a.change {
            text.push_str(&format!("         to allow it: {change}\n"));
        }
        crate::say::out(&text);
    }
}

fn read(file: &Path) -> Result<Policy> {
    Policy::read(file).map_err(|e| Failure::new(Code::BadPolicy, e.to_string()))
}

#[cfg(test)]
mod tests;
