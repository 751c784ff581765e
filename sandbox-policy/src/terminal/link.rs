//! Which hyperlinks (OSC 8) may reach the user's terminal: a link opens in the user's browser on
//! a click, carrying whatever the agent put in its address, under text the agent chose. So a
//! link passes only to the web, to a public host named by its own visible text, and never to
//! the user's own machine or network.

/// A web link's address, checked: `http(s)://HOST[:PORT][/…]` with a host that is a public
/// name or address. None for anything else: another scheme, user information (`a@b`, which
/// shows one host and opens another), a host that is loopback, private, link-local or
/// unqualified (`localhost`, `intranet`, `printer.local`), or an address written in a form
/// browsers read as a number (`2130706433`, `0x7f.1`).
pub fn web_host(uri: &[u8]) -> Option<String> {
    let uri = std::str::from_utf8(uri).ok()?;
    let rest = uri.strip_prefix("https://").or_else(|| uri.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains(['@', '\\', '%']) {
        return None;
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => {
            let (address, _) = v6.split_once(']')?;
            let address: std::net::Ipv6Addr = address.parse().ok()?;
            return public_v6(&address).then(|| format!("[{address}]"));
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            Some(_) => return None,
            None => authority,
        },
    };
    let host = host.to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host);
    if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
        return None;
    }
    let last = host.rsplit('.').next().unwrap_or_default();
    // WHATWG URL: a host whose last label is a number is an IPv4 address, in any of its forms.
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        let address: std::net::Ipv4Addr = host.parse().ok()?;
        return public_v4(&address).then(|| address.to_string());
    }
    let local = [".localhost", ".local", ".internal", ".lan", ".home.arpa", ".intranet"];
    if !host.contains('.') || host.split('.').any(str::is_empty) || local.iter().any(|s| host.ends_with(s)) {
        return None;
    }
    Some(host.to_string())
}

fn public_v4(address: &std::net::Ipv4Addr) -> bool {
    let [a, b, ..] = address.octets();
    !(address.is_loopback()
        || address.is_private()
        || address.is_link_local()
        || address.is_unspecified()
        || address.is_broadcast()
        || address.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || a >= 224)
}

fn public_v6(address: &std::net::Ipv6Addr) -> bool {
    if let Some(v4) = address.to_ipv4_mapped() {
        return public_v4(&v4);
    }
    let first = address.segments()[0];
    !(address.is_loopback()
        || address.is_unspecified()
        || address.is_multicast()
        || first & 0xfe00 == 0xfc00
        || first & 0xffc0 == 0xfe80)
}

/// Whether the visible text of a link says where it goes: it is the address itself (with or
/// without its scheme, or a last `/`), or the address's host. Nothing else: a host named
/// inside other text (`https://docs.example.com/attacker.example`) shows one site and opens
/// another.
pub fn text_names(text: &str, uri: &str, host: &str) -> bool {
    let bare = |s: &str| {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")).unwrap_or(&s).to_string();
        s.strip_suffix('/').unwrap_or(&s).to_string()
    };
    let text = bare(text);
    text == host || text == bare(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_web_hosts_are_link_targets() {
        for (uri, host) in [
            ("https://docs.anthropic.com/en/docs", "docs.anthropic.com"),
            ("http://Example.COM:8080/x?y=1", "example.com"),
            ("https://example.com.", "example.com"),
            ("https://93.184.215.14/", "93.184.215.14"),
            ("https://[2606:4700::1111]/", "[2606:4700::1111]"),
        ] {
            assert_eq!(web_host(uri.as_bytes()).as_deref(), Some(host), "{uri}");
        }
        for uri in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "https://docs.anthropic.com@attacker.example/",
            "http://localhost:3000/",
            "http://app.localhost/",
            "http://intranet/",
            "http://printer.local/",
            "http://127.0.0.1:8080/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f.0.0.1/",
            "http://10.0.0.5/",
            "http://192.168.1.1/",
            "http://172.16.0.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::1]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://exa%6dple.com/",
            "http://a..b/",
            "https:///x",
        ] {
            assert_eq!(web_host(uri.as_bytes()), None, "{uri}");
        }
    }

    #[test]
    fn the_text_must_name_the_host() {
        let uri = "https://attacker.example/?d=secret";
        let host = "attacker.example";
        assert!(text_names(uri, uri, host));
        assert!(text_names(" attacker.example/?d=secret", uri, host));
        assert!(text_names("attacker.example", uri, host));
        assert!(text_names("https://attacker.example/", uri, host));
        for lie in [
            "https://docs.anthropic.com/en/docs",
            // The host named inside other text (found by a red team).
            "https://docs.anthropic.com/en/attacker.example",
            "https://github.com/login?next=attacker.example",
            "docs.anthropic.com attacker.example",
            "see attacker.example.",
            "https://attacker.example/docs",
            "docs",
            "docs.anthropic.com.attacker.example",
            "attacker.example.com",
            "my-attacker.example",
            "",
        ] {
            assert!(!text_names(lie, uri, host), "{lie}");
        }
    }
}
