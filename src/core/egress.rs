//! Which addresses a task's callback may reach (DESIGN §6, "Callbacks"). Anyone who can create an
//! AxTask names the URL and reads the outcome on the task, so without this the operator would be a
//! probe of its own network: loopback, the cloud metadata service on link-local addresses, the pod
//! and service networks, the API server. Public addresses are admitted; loopback, link-local,
//! private and reserved ones only when the operator's allowlist (`--callback-allow`) admits them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

/// What kind of network an address belongs to, as far as callbacks care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// Reachable on the internet: always admitted.
    Public,
    /// This host (127.0.0.0/8, ::1, and 0.0.0.0/8, which Linux connects to this host).
    Loopback,
    /// 169.254.0.0/16 and fe80::/10: among them the cloud metadata service 169.254.169.254.
    LinkLocal,
    /// RFC 1918, shared address space 100.64.0.0/10 (often pod networks), unique-local fc00::/7:
    /// the cluster's own networks.
    Private,
    /// Multicast, broadcast, documentation, benchmarking and other special-purpose ranges.
    Reserved,
}

impl AddressClass {
    pub fn as_str(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Loopback => "loopback",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Private => "private",
            AddressClass::Reserved => "reserved",
        }
    }
}

/// The class of an address; IPv4 addresses inside IPv6 (mapped, NAT64, 6to4) count as the IPv4
/// address they reach.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip.to_canonical() {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = ip.octets();
    match (a, b, c) {
        (127, _, _) | (0, _, _) => AddressClass::Loopback,
        (169, 254, _) => AddressClass::LinkLocal,
        (10, _, _) | (192, 168, _) => AddressClass::Private,
        (172, 16..=31, _) | (100, 64..=127, _) => AddressClass::Private,
        // IETF protocol assignments, documentation, benchmarking, multicast, reserved, broadcast.
        (192, 0, 0) | (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => AddressClass::Reserved,
        (198, 18..=19, _) | (224..=255, _, _) => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    let segments = ip.segments();
    let embedded_v4 = |high: u16, low: u16| {
        Ipv4Addr::new((high >> 8) as u8, high as u8, (low >> 8) as u8, low as u8)
    };
    if ip.is_loopback() {
        return AddressClass::Loopback;
    }
    match segments {
        // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => classify_v4(embedded_v4(high, low)),
        // 6to4 (2002::/16) carries an IPv4 address in bits 16..48.
        [0x2002, high, low, ..] => classify_v4(embedded_v4(high, low)),
        // Unspecified and the deprecated IPv4-compatible ::/96.
        [0, 0, 0, 0, 0, 0, _, _] => AddressClass::Reserved,
        [first, ..] if first & 0xffc0 == 0xfe80 => AddressClass::LinkLocal,
        // Unique local fc00::/7 and the deprecated site-local fec0::/10.
        [first, ..] if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 => {
            AddressClass::Private
        }
        // Multicast, documentation 2001:db8::/32, Teredo 2001::/32 (tunnels to any IPv4 address).
        [first, ..] if first & 0xff00 == 0xff00 => AddressClass::Reserved,
        [0x2001, 0x0db8, ..] | [0x2001, 0, ..] => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

/// What the operator's administrator admits beyond public addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    /// Addresses in these networks are admitted, whatever their class.
    networks: Vec<IpNet>,
    /// Host names equal to one of these or ending in `.` + one of them (lower case, no trailing
    /// dot) may resolve to private addresses. Never to loopback or link-local ones: a name is only
    /// as trustworthy as the DNS answering for it, so those need a network entry.
    host_suffixes: Vec<String>,
}

/// One entry of `--callback-allow` that is neither a network nor a host name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "callback allowlist entry {entry:?} is neither an address, a CIDR (10.0.0.0/8) nor a host suffix (svc.cluster.local)"
)]
pub struct AllowlistError {
    pub entry: String,
}

impl Allowlist {
    /// Parses entries such as `10.0.0.0/8`, `127.0.0.2`, `fd00::/8`, `svc.cluster.local` or
    /// `.example.com`; blank entries are skipped.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, AllowlistError> {
        let mut allow = Allowlist::default();
        for raw in entries {
            let entry = raw.trim();
            if entry.is_empty() {
                continue;
            }
            if let Ok(net) = IpNet::from_str(entry) {
                allow.networks.push(net.trunc());
            } else if let Ok(ip) = IpAddr::from_str(entry) {
                allow.networks.push(IpNet::from(ip));
            } else if let Some(suffix) = host_suffix(entry) {
                allow.host_suffixes.push(suffix);
            } else {
                return Err(AllowlistError {
                    entry: entry.to_string(),
                });
            }
        }
        Ok(allow)
    }

    pub fn is_empty(&self) -> bool {
        self.networks.is_empty() && self.host_suffixes.is_empty()
    }

    fn admits_network(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.networks
            .iter()
            .any(|net| net.contains(&ip) || net.contains(&canonical))
    }

    fn admits_host(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.host_suffixes.iter().any(|suffix| {
            host == *suffix
                || host
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|rest| rest.ends_with('.'))
        })
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self
            .networks
            .iter()
            .map(ToString::to_string)
            .chain(self.host_suffixes.iter().cloned())
            .collect();
        if entries.is_empty() {
            f.write_str("(empty)")
        } else {
            f.write_str(&entries.join(","))
        }
    }
}

/// A host suffix entry in canonical form, if `entry` is one: DNS labels of letters, digits, `-`
/// and `_`, with an optional leading or trailing dot.
fn host_suffix(entry: &str) -> Option<String> {
    let name = normalize_host(entry.strip_prefix('.').unwrap_or(entry));
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (!name.is_empty() && name.split('.').all(valid_label)).then_some(name)
}

fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Why a callback destination is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub host: String,
    pub ip: IpAddr,
    pub class: AddressClass,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let literal = self
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip == self.ip);
        if literal {
            write!(f, "{} is a {} address", self.ip, self.class.as_str())?;
        } else {
            write!(
                f,
                "{} is {}, a {} address",
                self.host,
                self.ip,
                self.class.as_str()
            )?;
        }
        f.write_str(
            ", which the operator does not call unless its callback allowlist (--callback-allow) \
             admits it",
        )
    }
}

impl std::error::Error for Refusal {}

/// Whether the operator may connect to `ip`, which `host` (a name or the address itself, as the
/// URL wrote it) resolved to.
pub fn admit(allow: &Allowlist, host: &str, ip: IpAddr) -> Result<(), Refusal> {
    let class = classify(ip);
    let admitted = match class {
        AddressClass::Public => true,
        AddressClass::Private => allow.admits_network(ip) || allow.admits_host(host),
        AddressClass::Loopback | AddressClass::LinkLocal | AddressClass::Reserved => {
            allow.admits_network(ip)
        }
    };
    if admitted {
        Ok(())
    } else {
        Err(Refusal {
            host: host.to_string(),
            ip,
            class,
        })
    }
}

/// [`admit`] for every address a host resolved to: one refused address refuses the host, as the
/// connection could go to any of them.
pub fn admit_all(
    allow: &Allowlist,
    host: &str,
    ips: impl IntoIterator<Item = IpAddr>,
) -> Result<(), Refusal> {
    ips.into_iter().try_for_each(|ip| admit(allow, host, ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an IP address")
    }

    fn allow(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries.iter().copied()).expect("a valid allowlist")
    }

    #[test]
    fn addresses_fall_in_their_class() {
        use AddressClass::*;
        for (address, class) in [
            ("127.0.0.1", Loopback),
            ("127.0.0.2", Loopback),
            ("0.0.0.0", Loopback),
            ("::1", Loopback),
            ("::ffff:127.0.0.1", Loopback),
            ("169.254.169.254", LinkLocal),
            ("fe80::1", LinkLocal),
            ("::ffff:169.254.169.254", LinkLocal),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("2002:a9fe:a9fe::1", LinkLocal),
            ("10.96.0.1", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("fd00::1", Private),
            ("::", Reserved),
            ("224.0.0.1", Reserved),
            ("255.255.255.255", Reserved),
            ("192.0.2.1", Reserved),
            ("ff02::1", Reserved),
            ("2001:db8::1", Reserved),
            ("2001::1", Reserved),
            ("8.8.8.8", Public),
            ("172.32.0.1", Public),
            ("100.128.0.1", Public),
            ("2606:4700::1111", Public),
            ("::ffff:8.8.8.8", Public),
        ] {
            assert_eq!(classify(ip(address)), class, "{address}");
        }
    }

    #[test]
    fn by_default_only_public_addresses_are_admitted() {
        let none = Allowlist::default();
        assert!(admit(&none, "example.com", ip("93.184.215.14")).is_ok());
        for address in [
            "127.0.0.1",
            "169.254.169.254",
            "10.0.0.1",
            "::1",
            "fd00::1",
            "::",
        ] {
            let refusal = admit(&none, "h", ip(address)).expect_err(address);
            assert_eq!(refusal.ip, ip(address));
        }
        let refusal = admit(&none, "169.254.169.254", ip("169.254.169.254")).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "169.254.169.254 is a link-local address, which the operator does not call unless \
             its callback allowlist (--callback-allow) admits it"
        );
        let refusal = admit(&none, "localhost", ip("127.0.0.1")).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "localhost is 127.0.0.1, a loopback address, which the operator does not call unless \
             its callback allowlist (--callback-allow) admits it"
        );
    }

    #[test]
    fn networks_admit_any_class_and_only_their_addresses() {
        let list = allow(&["127.0.0.2", "10.0.0.0/8", "fd00::/8"]);
        assert!(admit(&list, "127.0.0.2", ip("127.0.0.2")).is_ok());
        assert!(admit(&list, "::ffff:127.0.0.2", ip("::ffff:127.0.0.2")).is_ok());
        assert!(admit(&list, "127.0.0.1", ip("127.0.0.1")).is_err());
        assert!(admit(&list, "svc", ip("10.1.2.3")).is_ok());
        assert!(admit(&list, "svc", ip("192.168.0.1")).is_err());
        assert!(admit(&list, "svc", ip("fd12::1")).is_ok());
        assert!(admit(&list, "meta", ip("169.254.169.254")).is_err());
    }

    #[test]
    fn host_suffixes_admit_private_addresses_of_their_names_only() {
        let list = allow(&["svc.cluster.local", ".Example.COM."]);
        let private = ip("10.96.0.10");
        assert!(admit(&list, "hook.team-a.svc.cluster.local", private).is_ok());
        assert!(admit(&list, "svc.cluster.local.", private).is_ok());
        assert!(admit(&list, "HOOKS.example.com", private).is_ok());
        assert!(admit(&list, "evilsvc.cluster.local", private).is_err());
        assert!(admit(&list, "example.com.evil.net", private).is_err());
        // A name is as trustworthy as its DNS: loopback and link-local need a network entry.
        assert!(admit(&list, "a.svc.cluster.local", ip("127.0.0.1")).is_err());
        assert!(admit(&list, "a.svc.cluster.local", ip("169.254.169.254")).is_err());
    }

    #[test]
    fn one_refused_address_refuses_the_host() {
        let none = Allowlist::default();
        let mixed = [ip("93.184.215.14"), ip("127.0.0.1")];
        let refusal = admit_all(&none, "rebinding.example", mixed).unwrap_err();
        assert_eq!(refusal.ip, ip("127.0.0.1"));
        assert!(admit_all(&none, "example.com", [ip("93.184.215.14")]).is_ok());
    }

    #[test]
    fn allowlist_entries_are_parsed_or_rejected() {
        let list = allow(&[" 10.0.0.0/8 ", "", "10.1.2.3/8", "::1", "a-b_c.example"]);
        assert_eq!(
            list.to_string(),
            "10.0.0.0/8,10.0.0.0/8,::1/128,a-b_c.example"
        );
        assert!(Allowlist::default().is_empty());
        for bad in [
            "10.0.0.0/33",
            "http://x",
            "a..b",
            "*.example.com",
            "x/y",
            ".",
        ] {
            assert_eq!(
                Allowlist::parse([bad]),
                Err(AllowlistError { entry: bad.into() }),
                "{bad}"
            );
        }
    }

    proptest! {
        /// Whatever the allowlist, an address outside its networks that is not public is refused
        /// for a host that matches no suffix.
        #[test]
        fn nothing_but_public_addresses_pass_an_unrelated_allowlist(bits in any::<u128>(), v4 in any::<u32>(), use_v4 in any::<bool>()) {
            let address = if use_v4 { IpAddr::V4(Ipv4Addr::from(v4)) } else { IpAddr::V6(Ipv6Addr::from(bits)) };
            let list = allow(&["192.0.2.0/24", "example.com"]);
            let admitted = admit(&list, "host.invalid", address).is_ok();
            let in_list = IpNet::from_str("192.0.2.0/24").unwrap().contains(&address.to_canonical());
            prop_assert_eq!(admitted, classify(address) == AddressClass::Public || in_list);
        }
    }
}
