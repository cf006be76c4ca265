//! Where the root is (`ip:port`, `ifname:ip:port`, `[v6]:port`, `ifname:[v6]:port`) and which local
//! address a unique id's root listens on.

use super::sys;
use crate::error::{Error, Result};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, ToSocketAddrs};

/// Linux limit on interface names (IFNAMSIZ less the NUL).
const MAX_IFNAME_LEN: usize = 15;

/// Where rank 0's root listener is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootAddress {
    pub addr: std::net::SocketAddr,
    /// The local interface to use for bootstrap traffic; also the scope of an IPv6 link-local address.
    pub ifname: Option<String>,
}

impl RootAddress {
    /// Parses `ip:port`, `ifname:ip:port`, `[v6addr]:port` or `ifname:[v6addr]:port`. A host name in
    /// place of an IPv4 address is resolved. A link-local IPv6 address takes its scope from `ifname` or
    /// from a `%scope` suffix inside the brackets.
    pub fn parse(s: &str) -> Result<RootAddress> {
        let bad = |why: &str| Error::invalid_argument(format!("bootstrap address (ipPortPair) \"{s}\": {why}"));
        if s.trim().is_empty() {
            return Err(bad(
                "empty; expected ip:port, ifname:ip:port, [v6addr]:port or ifname:[v6addr]:port",
            ));
        }
        if s.trim() != s {
            return Err(bad("has leading or trailing white space"));
        }
        let (ifname, host, port, bracketed) = match s.find('[') {
            Some(open) => {
                let prefix = &s[..open];
                let ifname = match prefix.strip_suffix(':') {
                    Some(name) => Some(name),
                    None if prefix.is_empty() => None,
                    None => return Err(bad("expected ifname:[v6addr]:port")),
                };
                let close = s[open..]
                    .find(']')
                    .map(|i| open + i)
                    .ok_or_else(|| bad("missing ']'"))?;
                let port = s[close + 1..]
                    .strip_prefix(':')
                    .ok_or_else(|| bad("missing ':port' after ']'"))?;
                (ifname, &s[open + 1..close], port, true)
            }
            None => {
                let parts: Vec<&str> = s.split(':').collect();
                match parts[..] {
                    [host, port] => (None, host, port, false),
                    [ifname, host, port] => (Some(ifname), host, port, false),
                    [_] => return Err(bad("missing ':port'")),
                    _ => {
                        return Err(bad("too many ':'; write IPv6 addresses in brackets, as [addr]:port"));
                    }
                }
            }
        };
        if let Some(name) = ifname {
            check_ifname(name).map_err(|why| bad(&why))?;
        }
        let port = parse_port(port).map_err(|why| bad(&why))?;
        let addr = if bracketed {
            parse_v6(host, ifname, port).map_err(|why| bad(&why))?
        } else {
            parse_host(host, port).map_err(|why| bad(&why))?
        };
        Ok(RootAddress {
            addr,
            ifname: ifname.map(str::to_string),
        })
    }

    /// The address of this machine on `ifname` in the root's address family, to bind and advertise;
    /// `None` when no interface was named (then the route to the root decides).
    pub fn local_ip(&self) -> Result<Option<IpAddr>> {
        let Some(name) = &self.ifname else {
            return Ok(None);
        };
        let all = sys::interfaces().map_err(|e| Error::io("listing network interfaces", e))?;
        all.iter()
            .find(|i| i.name == *name && i.addr.is_ipv4() == self.addr.is_ipv4())
            .map(|i| Some(i.addr))
            .ok_or_else(|| {
                let family = if self.addr.is_ipv4() { "IPv4" } else { "IPv6" };
                Error::invalid_argument(format!(
                    "bootstrap address (ipPortPair) \"{self}\": interface {name} has no {family} address"
                ))
            })
    }
}

impl fmt::Display for RootAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = &self.ifname {
            write!(f, "{name}:")?;
        }
        write!(f, "{}", self.addr)
    }
}

fn check_ifname(name: &str) -> std::result::Result<(), String> {
    let ok_char = |c: char| c.is_ascii_graphic() && !matches!(c, '/' | ':' | '%' | '[' | ']');
    if name.is_empty() || name.len() > MAX_IFNAME_LEN || !name.chars().all(ok_char) {
        return Err(format!("\"{name}\" is not an interface name"));
    }
    Ok(())
}

fn parse_port(port: &str) -> std::result::Result<u16, String> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port \"{port}\" is not a number"));
    }
    match port.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(format!("port {port} out of range 1-65535")),
    }
}

fn parse_v6(host: &str, ifname: Option<&str>, port: u16) -> std::result::Result<SocketAddr, String> {
    let (ip, scope) = match host.split_once('%') {
        Some((ip, scope)) => (ip, Some(scope)),
        None => (host, None),
    };
    let ip: Ipv6Addr = ip.parse().map_err(|_| format!("\"{ip}\" is not an IPv6 address"))?;
    let scope_name = match (scope, ifname) {
        (Some(_), Some(_)) => {
            return Err("give the interface once, either as ifname: or as %scope".into());
        }
        (Some(s), None) => Some(s),
        (None, name) => name,
    };
    let scope_id = match scope_name {
        Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse::<u32>().map_err(|_| format!("scope {s} out of range"))?
        }
        // The scope only matters for link-local addresses; elsewhere the interface is only a preference.
        Some(s) if is_link_local(&ip) => sys::interface_index(s).ok_or_else(|| format!("no interface named {s}"))?,
        _ => 0,
    };
    Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope_id)))
}

fn parse_host(host: &str, port: u16) -> std::result::Result<SocketAddr, String> {
    if host.is_empty() {
        return Err("missing the address before ':port'".into());
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let ip: Ipv4Addr = host.parse().map_err(|_| format!("\"{host}\" is not an IPv4 address"))?;
        return Ok(SocketAddr::new(IpAddr::V4(ip), port));
    }
    let host_char = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_';
    if !host.bytes().all(host_char) {
        return Err(format!("\"{host}\" is neither an IPv4 address nor a host name"));
    }
    let resolved: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host {host}: {e}"))?
        .collect();
    // Prefer IPv4, as the legacy library did.
    resolved
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| resolved.first())
        .copied()
        .ok_or_else(|| format!("host {host} has no address"))
}

fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The address (port 0) a unique id's root listens on: the interface named by `MSCCLPP_SOCKET_IFNAME`,
/// else the first non-loopback IPv4 interface that is up, else 127.0.0.1.
pub fn unique_id_root_addr() -> Result<SocketAddr> {
    let wanted = crate::settings::SOCKET_IFNAME.text();
    let all = sys::interfaces().map_err(|e| Error::io("listing network interfaces", e))?;
    choose_root_addr(&all, wanted.as_deref())
}

/// The choice of `unique_id_root_addr`, given the interfaces and the environment variable's value.
pub fn choose_root_addr(all: &[sys::Interface], wanted: Option<&str>) -> Result<SocketAddr> {
    let to_addr = |i: &sys::Interface| match i.addr {
        IpAddr::V4(ip) => SocketAddr::new(IpAddr::V4(ip), 0),
        IpAddr::V6(ip) => {
            let scope = if is_link_local(&ip) { i.index } else { 0 };
            SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, scope))
        }
    };
    if let Some(name) = wanted {
        let name = name.trim();
        let named: Vec<&sys::Interface> = all.iter().filter(|i| i.name == name && i.up).collect();
        // IPv4 first, then a global IPv6 address, then a link-local one.
        let pick = named
            .iter()
            .find(|i| i.addr.is_ipv4())
            .or_else(|| {
                named
                    .iter()
                    .find(|i| matches!(i.addr, IpAddr::V6(ip) if !is_link_local(&ip)))
            })
            .or_else(|| named.first());
        return pick.map(|i| to_addr(i)).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{}={name}: no interface of that name is up with an address",
                crate::settings::SOCKET_IFNAME.name
            ))
        });
    }
    Ok(all
        .iter()
        .find(|i| i.up && !i.loopback && i.addr.is_ipv4())
        .map(to_addr)
        .unwrap_or_else(|| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn ok(s: &str) -> RootAddress {
        RootAddress::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn bad(s: &str, needle: &str) {
        let e = RootAddress::parse(s).expect_err(s);
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{s}");
        assert!(e.message.contains("ipPortPair"), "{s}: {}", e.message);
        assert!(e.message.contains(needle), "{s}: {} lacks {needle}", e.message);
    }

    #[test]
    fn parses_ipv4_and_interface_forms() {
        let a = ok("10.1.2.3:50000");
        assert_eq!(a.addr, "10.1.2.3:50000".parse().unwrap());
        assert_eq!(a.ifname, None);
        let a = ok("eth0:192.168.0.1:1");
        assert_eq!(a.addr, "192.168.0.1:1".parse().unwrap());
        assert_eq!(a.ifname.as_deref(), Some("eth0"));
        assert_eq!(a.to_string(), "eth0:192.168.0.1:1");
        assert_eq!(ok("127.0.0.1:65535").addr.port(), 65535);
    }

    #[test]
    fn parses_ipv6_forms() {
        let a = ok("[::1]:6000");
        assert_eq!(a.addr, "[::1]:6000".parse().unwrap());
        let a = ok("ib0:[fd00::2]:6000");
        assert_eq!(a.ifname.as_deref(), Some("ib0"));
        assert_eq!(a.addr, "[fd00::2]:6000".parse().unwrap());
        let a = ok("[fe80::1%7]:6000");
        assert!(matches!(a.addr, SocketAddr::V6(v6) if v6.scope_id() == 7));
        let lo = sys::interfaces().unwrap().into_iter().find(|i| i.loopback).unwrap();
        let a = ok(&format!("{}:[fe80::1]:6000", lo.name));
        assert!(matches!(a.addr, SocketAddr::V6(v6) if v6.scope_id() == lo.index));
    }

    #[test]
    fn resolves_localhost() {
        assert!(ok("localhost:7000").addr.ip().is_loopback());
    }

    #[test]
    fn rejects_bad_addresses_naming_the_problem() {
        bad("", "empty");
        bad(" 1.2.3.4:5", "white space");
        bad("1.2.3.4", "missing ':port'");
        bad("1.2.3.4:", "not a number");
        bad("1.2.3.4:0", "port 0 out of range");
        bad("1.2.3.4:65536", "port 65536 out of range");
        bad("1.2.3.4:99999999999999999999", "out of range");
        bad("1.2.3.4:-1", "not a number");
        bad("1.2.3.4:80x", "not a number");
        bad("256.1.1.1:80", "not an IPv4 address");
        bad("1.2.3:80", "not an IPv4 address");
        bad("::1:80", "brackets");
        bad("[::1:80", "missing ']'");
        bad("[::1]80", "missing ':port'");
        bad("[zz::1]:80", "not an IPv6 address");
        bad("[1.2.3.4]:80", "not an IPv6 address");
        bad("eth0[::1]:80", "ifname:[v6addr]:port");
        bad(":1.2.3.4:80", "not an interface name");
        bad("averyveryverylongifname:1.2.3.4:80", "not an interface name");
        bad("eth0:[fe80::1%2]:80", "give the interface once");
        bad("nosuchif9:[fe80::1]:80", "no interface named nosuchif9");
        bad("bad host!:80", "neither");
        bad(":80", "missing the address");
    }

    #[test]
    fn local_ip_comes_from_the_named_interface() {
        let lo = sys::interfaces()
            .unwrap()
            .into_iter()
            .find(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .unwrap();
        let a = ok(&format!("{}:127.0.0.1:5000", lo.name));
        assert_eq!(a.local_ip().unwrap(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_eq!(ok("127.0.0.1:5000").local_ip().unwrap(), None);
        let e = ok("nosuchif9:127.0.0.1:5000").local_ip().unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("nosuchif9"));
    }

    fn iface(name: &str, addr: &str, index: u32, up: bool, loopback: bool) -> sys::Interface {
        sys::Interface {
            name: name.into(),
            addr: addr.parse().unwrap(),
            index,
            up,
            loopback,
        }
    }

    #[test]
    fn unique_id_root_prefers_named_then_first_up_ipv4() {
        let all = vec![
            iface("lo", "127.0.0.1", 1, true, true),
            iface("down0", "10.9.9.9", 2, false, false),
            iface("eth0", "fe80::1", 3, true, false),
            iface("eth0", "fd00::2", 3, true, false),
            iface("eth1", "192.0.2.7", 4, true, false),
            iface("ib0", "fe80::5", 5, true, false),
        ];
        assert_eq!(choose_root_addr(&all, None).unwrap(), "192.0.2.7:0".parse().unwrap());
        assert_eq!(
            choose_root_addr(&all, Some("eth1")).unwrap(),
            "192.0.2.7:0".parse().unwrap()
        );
        assert_eq!(
            choose_root_addr(&all, Some("eth0")).unwrap(),
            "[fd00::2]:0".parse().unwrap()
        );
        let ib = choose_root_addr(&all, Some("ib0")).unwrap();
        assert!(matches!(ib, SocketAddr::V6(v6) if v6.scope_id() == 5));
        assert_eq!(
            choose_root_addr(&all, Some("lo")).unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        let e = choose_root_addr(&all, Some("down0")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("MSCCLPP_SOCKET_IFNAME=down0"));
        let only_lo = vec![iface("lo", "127.0.0.1", 1, true, true)];
        assert_eq!(
            choose_root_addr(&only_lo, None).unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(choose_root_addr(&[], None).unwrap(), "127.0.0.1:0".parse().unwrap());
    }
}
