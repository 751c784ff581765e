//! A policy file as YAML writes it: the serde form of each key (`version`, `domains`,
//! `services`, `cidrs`, `inbound`, `allow`, `apis`, `forward`), every value checked in its `Deserialize`
//! impl, so that the parser reports it at its own line and column. `Policy` (the crate's root)
//! merges what these give.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::apis;
use crate::pattern::*;
use crate::{DEFAULT_PORTS, services};

/// Ports as YAML writes them: a list of numbers, never empty.
pub(crate) struct PortList(pub(crate) Ports);

impl<'de> Deserialize<'de> for PortList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PortList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of port numbers, as in [443, 8443]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PortList, A::Error> {
                let mut ports = Ports::new();
                while let Some(port) = seq.next_element::<Port>()? {
                    ports.insert(port.0);
                }
                if ports.is_empty() {
                    return Err(de::Error::custom("empty port list: leave `ports` out for 80 and 443"));
                }
                Ok(PortList(ports))
            }
        }
        d.deserialize_seq(V)
    }
}

pub(crate) struct Port(pub(crate) u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a port number (1-65535)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Port, E> {
                port_in_range(v).map(Port).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Port, E> {
                Err(E::custom(format!("port {v} is out of range (1-65535)")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A mapping-form entry, `{<key>: …, ports: […]}` (and, for domains, `opaque: […]` and
/// `udp: […]`): the value of `key` parsed by `parse`, and what it opens. `ports` default to 80
/// and 443 when left out.
pub(crate) fn entry_with_ports<'de, A: MapAccess<'de>, T>(
    mut map: A,
    key: &'static str,
    domain: bool,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(T, Access), A::Error> {
    let (mut value, mut ports, mut access) = (None, None, Access::default());
    while let Some(name) = map.next_key::<String>()? {
        if name == key {
            let text: String = map.next_value()?;
            value = Some(parse(&text).map_err(de::Error::custom)?);
        } else if name == "ports" {
            ports = Some(map.next_value::<PortList>()?.0);
        } else if name == "opaque" && domain {
            access.opaque = map.next_value::<PortList>()?.0;
        } else if name == "udp" && domain {
            access.udp = map.next_value::<PortList>()?.0;
        } else if name == "ech" && domain {
            access.ech = map.next_value::<bool>()?;
        } else if name == "upload" && domain {
            access.upload = Some(map.next_value::<UploadSize>()?.0);
        } else if name == "private" && domain {
            access.private = map.next_value::<bool>()?;
        } else {
            let expected = if domain {
                format!("{key}, ports, opaque, udp, ech, upload, private")
            } else {
                format!("{key}, ports")
            };
            return Err(de::Error::custom(format!("unknown key `{name}` (expected one of: {expected})")));
        }
    }
    let value = value.ok_or_else(|| de::Error::custom(format!("entry has `ports` but no `{key}`")))?;
    // Ports listed as opaque are opened for that alone, not also checked.
    access.tcp = match ports {
        Some(ports) => ports,
        None if access.opaque.is_empty() && access.udp.is_empty() => Ports::from(DEFAULT_PORTS),
        None => Ports::new(),
    };
    if let Some(port) = access.tcp.intersection(&access.opaque).next() {
        return Err(de::Error::custom(format!("port {port} is in both `ports` and `opaque`: choose one")));
    }
    if access.upload.is_some() && !access.udp.is_empty() {
        return Err(de::Error::custom(
            "`upload` is counted by the name check, on TCP; UDP to this entry's `udp` ports would carry \
             no budget: put the UDP ports in an entry of their own, or leave out `upload`"
                .to_string(),
        ));
    }
    if access.ech && access.tcp.is_empty() {
        return Err(de::Error::custom(
            "`ech` concerns the name check of `ports`, and this entry opens none".to_string(),
        ));
    }
    Ok((value, access))
}

/// `upload: 64MB` (or a number of bytes): bytes an hour.
pub(crate) struct UploadSize(pub(crate) u64);

impl<'de> Deserialize<'de> for UploadSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UploadSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size an hour, as in 64MB or 1GiB")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<UploadSize, E> {
                parse_size(v).map(UploadSize).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<UploadSize, E> {
                parse_size(&v.to_string()).map(UploadSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for DomainRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DomainRule;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a domain (`api.example.com`, `*.example.com`, `host:8443`) or {domain, ports}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DomainRule, E> {
                let (pattern, ports) = parse_domain_with_ports(v).map_err(E::custom)?;
                Ok(DomainRule { pattern, access: Access::tcp(ports) })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DomainRule, A::Error> {
                let (pattern, access) = entry_with_ports(map, "domain", true, DomainPattern::parse)?;
                Ok(DomainRule { pattern, access })
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for CidrRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CidrRule;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address range (`10.0.0.0/8`) or {cidr, ports}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CidrRule, E> {
                let net = parse_cidr(v).map_err(E::custom)?;
                Ok(CidrRule { net, ports: Ports::from(DEFAULT_PORTS) })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CidrRule, A::Error> {
                let (net, access) = entry_with_ports(map, "cidr", false, parse_cidr)?;
                let ports = access.tcp;
                Ok(CidrRule { net, ports })
            }
        }
        d.deserialize_any(V)
    }
}

/// `version: 1`, the only version this sandbox-init reads.
pub(crate) struct Version;

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let version = u64::deserialize(d)?;
        if version != 1 {
            return Err(de::Error::custom(format!(
                "unsupported policy version {version} (this sandbox-init reads version 1)"
            )));
        }
        Ok(Version)
    }
}

/// `allow: none`: the explicit way to say a policy allows nothing.
pub(crate) struct AllowNone;

impl<'de> Deserialize<'de> for AllowNone {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = String::deserialize(d)?;
        if value != "none" {
            return Err(de::Error::custom(format!("`allow` takes only `none`, not `{value}`")));
        }
        Ok(AllowNone)
    }
}

/// A service name, checked against the bundles.
pub(crate) struct ServiceRef(pub(crate) String);

impl<'de> Deserialize<'de> for ServiceRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        let services = services();
        if !services.contains_key(&name) {
            let known: Vec<&str> = services.keys().map(String::as_str).collect();
            return Err(de::Error::custom(format!("unknown service `{name}` (known: {})", known.join(", "))));
        }
        Ok(ServiceRef(name))
    }
}

/// What a model API's requests may ask of the provider, under `apis: {NAME: …}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Whether a request may name tools that make the provider's servers contact a URL the
    /// request gives (remote MCP servers, URL fetching), carrying what the agent put there.
    #[serde(default)]
    pub remote_tools: RemoteTools,
}

/// `remote_tools: refuse` (the default) or `allow`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteTools {
    #[default]
    Refuse,
    Allow,
}

/// The name of a model API of [`apis::APIS`], checked.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ApiName(pub(crate) String);

impl<'de> Deserialize<'de> for ApiName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if apis::api(&name).is_none() {
            let known: Vec<&str> = apis::APIS.iter().map(|a| a.name).collect();
            return Err(de::Error::custom(format!("unknown API `{name}` (known: {})", known.join(", "))));
        }
        Ok(ApiName(name))
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a policy: a mapping with `version: 1` and `domains`, `services` or `cidrs`"
)]
pub(crate) struct PolicyFile {
    #[allow(dead_code)]
    pub(crate) version: Version,
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) description: Option<String>,
    #[serde(default)]
    pub(crate) domains: Vec<DomainRule>,
    #[serde(default)]
    pub(crate) services: Vec<ServiceRef>,
    #[serde(default)]
    pub(crate) cidrs: Vec<CidrRule>,
    #[serde(default)]
    pub(crate) inbound: Option<PortList>,
    #[serde(default)]
    pub(crate) allow: Option<AllowNone>,
    #[serde(default)]
    pub(crate) apis: BTreeMap<ApiName, ApiSettings>,
    #[serde(default)]
    pub(crate) forward: Option<crate::forward::ForwardMap>,
}
