//! Egress policies: what a task may reach beyond its container, and what the
//! worker's egress proxy records of what it tried. No I/O: the api checks a
//! client's `network` argument with these types, the worker's proxy decides
//! each connection with [`AllowList::allows`] and keeps an [`EgressLog`].
//!
//! A policy is `internet` (the task bridge: the internet, nothing private),
//! `none` (no network), or an allow-list of host names, reached only through
//! the proxy (docs/egress.md).

use serde::{Deserialize, Serialize};

use crate::options::Network;

/// At most this many entries in one allow-list.
pub const MAX_ALLOW_ENTRIES: usize = 32;
/// A DNS name is at most 253 characters (RFC 1035, written without the final dot).
pub const MAX_HOST_LEN: usize = 253;
/// At most this many distinct lines in a task's egress log; further distinct
/// attempts are counted in `dropped` (and their bytes in `dropped_bytes_*`).
pub const MAX_LOG_ENTRIES: usize = 64;
/// Of those, at most this many lines of refusals, so a task cannot fill the
/// log with refused attempts to hide what it did reach.
pub const MAX_REFUSED_ENTRIES: usize = 48;

/// Why an egress policy was refused. Shown to the client as is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EgressError {
    #[error(
        "network must be \"internet\", \"none\" or {{\"allow\": [host names]}}, e.g. \
         {{\"allow\": [\"pypi.org\", \"*.npmjs.org\"]}}; got {0}"
    )]
    Shape(String),
    #[error(
        "network allow-list entry {0:?} is an IP address; list host names (the proxy resolves \
         them itself and refuses private addresses)"
    )]
    IpLiteral(String),
    #[error(
        "network allow-list entry {0:?} would allow every host; list host names, or use \
         network \"internet\""
    )]
    Everything(String),
    #[error(
        "network allow-list entry {0:?} is not a host name: use letters, digits, '-' and '.', \
         at least two labels (e.g. \"pypi.org\"), optionally starting with \"*.\" for every \
         name under a domain (e.g. \"*.npmjs.org\")"
    )]
    BadName(String),
    #[error(
        "network allow-list entry {0:?} covers a whole top-level domain; name a domain under it \
         (e.g. \"*.example.org\")"
    )]
    TooBroad(String),
    #[error(
        "network allow-list entry {0:?} covers a public suffix: the names under it belong to \
         anyone who registers one (as with *.github.io or *.co.uk); name the hosts, or a \
         domain under it (e.g. \"*.acme.github.io\")"
    )]
    PublicSuffix(String),
    #[error(
        "network allow-list entry {entry:?} is outside {whose} ({ceiling}): every entry must be \
         one of those hosts or under one of those domains"
    )]
    OutsideCeiling {
        entry: String,
        whose: &'static str,
        ceiling: String,
    },
    #[error("network allow-list has {0} entries; at most {MAX_ALLOW_ENTRIES} are allowed")]
    TooMany(usize),
    #[error("network allow-list is empty; to allow nothing, use network \"none\"")]
    Empty,
}

/// One allow-list entry: an exact host name, or `*.<domain>` for every name
/// under a domain (not the domain itself: list both to allow both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Exact(String),
    /// The domain after `*.`.
    Under(String),
}

impl HostPattern {
    /// Parses one entry: case is folded and one final dot dropped.
    pub fn parse(entry: &str) -> Result<HostPattern, EgressError> {
        HostPattern::parse_with(entry, true)
    }

    /// `parse`, with the public suffix rule or without it (a stored entry,
    /// checked when it was asked for: a newer suffix list must not make an old
    /// record or key unreadable).
    fn parse_with(entry: &str, suffix_rule: bool) -> Result<HostPattern, EgressError> {
        let folded = entry.trim().to_ascii_lowercase();
        let name = folded.strip_suffix('.').unwrap_or(&folded);
        if name == "*" || name == "*." || name.is_empty() {
            return Err(EgressError::Everything(entry.to_owned()));
        }
        let is_ip = name.parse::<std::net::IpAddr>().is_ok()
            || name
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::Ipv6Addr>()
                .is_ok();
        if is_ip {
            return Err(EgressError::IpLiteral(entry.to_owned()));
        }
        let (under, host) = match name.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, name),
        };
        if under && !host.contains('.') && !host.is_empty() {
            return Err(EgressError::TooBroad(entry.to_owned()));
        }
        // Checked after the name's shape, so the list sees only host names.
        if suffix_rule && under && is_host_name(host) && is_public_suffix(host) {
            return Err(EgressError::PublicSuffix(entry.to_owned()));
        }
        if !is_host_name(host) {
            // All-digit labels with dots ("1.2.3") read as an address to many tools.
            if host
                .split('.')
                .all(|l| l.chars().all(|c| c.is_ascii_digit()))
            {
                return Err(EgressError::IpLiteral(entry.to_owned()));
            }
            return Err(EgressError::BadName(entry.to_owned()));
        }
        if under {
            Ok(HostPattern::Under(host.to_owned()))
        } else {
            Ok(HostPattern::Exact(host.to_owned()))
        }
    }

    /// Whether `host` (already folded by [`fold_host`]) is this entry's.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Under(d) => host
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

impl HostPattern {
    /// Whether every host `other` allows, this one allows too.
    pub fn covers(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
            (HostPattern::Exact(_), HostPattern::Under(_)) => false,
            (HostPattern::Under(_), HostPattern::Exact(h)) => self.matches(h),
            (HostPattern::Under(a), HostPattern::Under(b)) => a == b || self.matches(b),
        }
    }
}

/// Whether `domain` is on the public suffix list (its ICANN or its private
/// section): `co.uk`, `github.io`. A name the list does not know falls under
/// its default rule, the last label alone, so `corp.internal` is not one.
fn is_public_suffix(domain: &str) -> bool {
    psl::suffix_str(domain).is_some_and(|s| s.eq_ignore_ascii_case(domain))
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Under(d) => write!(f, "*.{d}"),
        }
    }
}

/// A DNS host name: dot-separated labels of letters, digits and '-' (not at
/// either end of a label), at least two labels, the last not all digits.
fn is_host_name(name: &str) -> bool {
    let labels: Vec<&str> = name.split('.').collect();
    name.len() <= MAX_HOST_LEN
        && labels.len() >= 2
        && labels.iter().all(|l| {
            (1..=63).contains(&l.len())
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
        && labels
            .last()
            .is_some_and(|l| !l.chars().all(|c| c.is_ascii_digit()))
}

/// A host name as a client wrote it (a CONNECT target, a `Host` header, a TLS
/// server name) in the form patterns match: lower case, no final dot.
pub fn fold_host(host: &str) -> String {
    let h = host.to_ascii_lowercase();
    h.strip_suffix('.').map(str::to_owned).unwrap_or(h)
}

/// A task's allowed hosts, checked. Stored in the task record as the entries
/// joined with ',' (`Field::EgressAllow`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList(Vec<HostPattern>);

impl AllowList {
    /// Checks every entry; the first bad one is the error, named.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, EgressError> {
        AllowList::parse_with(entries, true)
    }

    fn parse_with<S: AsRef<str>>(
        entries: &[S],
        suffix_rule: bool,
    ) -> Result<AllowList, EgressError> {
        if entries.is_empty() {
            return Err(EgressError::Empty);
        }
        if entries.len() > MAX_ALLOW_ENTRIES {
            return Err(EgressError::TooMany(entries.len()));
        }
        let mut out: Vec<HostPattern> = Vec::with_capacity(entries.len());
        for e in entries {
            let p = HostPattern::parse_with(e.as_ref(), suffix_rule)?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(AllowList(out))
    }

    /// Whether the list allows `host` (any case, final dot or not).
    pub fn allows(&self, host: &str) -> bool {
        let host = fold_host(host);
        self.0.iter().any(|p| p.matches(&host))
    }

    pub fn entries(&self) -> &[HostPattern] {
        &self.0
    }

    /// The first entry of this list that no pattern of `ceiling` covers, as the
    /// refusal naming it and the ceiling (`whose`: who set it, for the message).
    pub fn check_within(
        &self,
        ceiling: &AllowList,
        whose: &'static str,
    ) -> Result<(), EgressError> {
        match self
            .0
            .iter()
            .find(|e| !ceiling.0.iter().any(|c| c.covers(e)))
        {
            None => Ok(()),
            Some(e) => Err(EgressError::OutsideCeiling {
                entry: e.to_string(),
                whose,
                ceiling: ceiling.to_stored().replace(',', ", "),
            }),
        }
    }

    /// The stored form: entries joined with ','.
    pub fn to_stored(&self) -> String {
        self.0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Reads the stored form back (its shape checked again: a record is not
    /// trusted; the public suffix rule is the submit's, not applied again).
    pub fn from_stored(s: &str) -> Result<AllowList, EgressError> {
        let entries: Vec<&str> = s.split(',').filter(|e| !e.is_empty()).collect();
        AllowList::parse_with(&entries, false)
    }
}

/// A task's egress policy, whole.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Egress {
    #[default]
    Internet,
    None,
    Allow(AllowList),
}

impl Egress {
    /// The network kind the record stores in `Field::Network`.
    pub fn network(&self) -> Network {
        match self {
            Egress::Internet => Network::Internet,
            Egress::None => Network::None,
            Egress::Allow(_) => Network::Allow,
        }
    }

    pub fn allow_list(&self) -> Option<&AllowList> {
        match self {
            Egress::Allow(l) => Some(l),
            _ => None,
        }
    }

    /// The `network` argument of `run_script`: `"internet"`, `"none"` or
    /// `{"allow": [...]}`.
    pub fn from_json(v: &serde_json::Value) -> Result<Egress, EgressError> {
        use serde_json::Value;
        // What the client sent, shortened: the message must not echo a
        // request-sized value back.
        let shape = || EgressError::Shape(cut(&v.to_string()));
        match v {
            Value::String(s) => match s.as_str() {
                "internet" => Ok(Egress::Internet),
                "none" => Ok(Egress::None),
                _ => Err(shape()),
            },
            Value::Object(o) if o.len() == 1 => match o.get("allow") {
                Some(Value::Array(items)) => {
                    let names: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                    let names = names.ok_or_else(shape)?;
                    Ok(Egress::Allow(AllowList::parse(&names)?))
                }
                _ => Err(shape()),
            },
            _ => Err(shape()),
        }
    }

    /// The policy in the argument's shape (what `from_json` reads back).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Egress::Internet => "internet".into(),
            Egress::None => "none".into(),
            Egress::Allow(l) => serde_json::json!({
                "allow": l.entries().iter().map(ToString::to_string).collect::<Vec<_>>()
            }),
        }
    }

    /// The operator's `EGRESS_DEFAULT`: `internet`, `none`, or
    /// `allow:<host>,<host>,...`.
    pub fn from_setting(s: &str) -> Result<Egress, EgressError> {
        match s.trim() {
            "internet" => Ok(Egress::Internet),
            "none" => Ok(Egress::None),
            other => match other.strip_prefix("allow:") {
                Some(list) => {
                    let entries: Vec<&str> = list
                        .split(',')
                        .map(str::trim)
                        .filter(|e| !e.is_empty())
                        .collect();
                    Ok(Egress::Allow(AllowList::parse(&entries)?))
                }
                None => Err(EgressError::Shape(format!("{other:?}"))),
            },
        }
    }

    /// Back from a record's `network` and `egress_allow` fields.
    pub fn from_record(network: Network, allow: Option<&AllowList>) -> Egress {
        match (network, allow) {
            (Network::Internet, _) => Egress::Internet,
            (Network::None, _) => Egress::None,
            (Network::Allow, Some(l)) => Egress::Allow(l.clone()),
            // An allow task without its list may reach nothing.
            (Network::Allow, None) => Egress::None,
        }
    }
}

/// The first 200 characters of a client's value, for an error message.
fn cut(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

/// What the proxy did with one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allowed,
    /// The host is not on the list.
    NotAllowed,
    /// The port is not one the proxy opens (`EGRESS_PORTS`).
    Port,
    /// The name resolved to a private, host or special address.
    PrivateAddress,
    /// The name did not resolve.
    Unresolved,
    /// The TLS server name differs from the CONNECT host and is not allowed.
    ServerName,
    /// The tunnel did not open with a TLS ClientHello naming a host (in
    /// time): a tunnel carries TLS only.
    NotTls,
    /// The task already has as many connections open as it may.
    TooManyConnections,
    /// Allowed, but the host did not answer.
    Unreachable,
    /// Not a request the proxy understands (e.g. a CONNECT without a port).
    BadRequest,
}

impl Verdict {
    /// Allowed by the policy (whether or not the host then answered): what
    /// the worker's metrics count as `allowed`.
    pub fn allowed(self) -> bool {
        matches!(self, Verdict::Allowed | Verdict::Unreachable)
    }
}

/// One line of a task's egress log: every attempt at one host and port that
/// ended the same way, with their bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EgressAttempt {
    /// The host name asked for, as the proxy folded it (lower case).
    pub host: String,
    pub port: u16,
    pub verdict: Verdict,
    /// How many connections or requests.
    pub count: u64,
    /// Bytes from the task to the host.
    pub bytes_out: u64,
    /// Bytes from the host to the task.
    pub bytes_in: u64,
}

/// A task's egress log: one line per (host, port, verdict), in first-seen
/// order, at most [`MAX_LOG_ENTRIES`]; what did not fit is counted.
/// Stored as JSON in `Field::EgressLog`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EgressLog {
    pub attempts: Vec<EgressAttempt>,
    /// Attempts at further (host, port, verdict) lines that were not kept.
    pub dropped: u64,
    /// The bytes of those, to the hosts and from them.
    #[serde(default)]
    pub dropped_bytes_out: u64,
    #[serde(default)]
    pub dropped_bytes_in: u64,
}

impl EgressLog {
    /// Counts one attempt; its bytes come with [`EgressLog::add_bytes`]
    /// (before or after it).
    pub fn record(&mut self, host: &str, port: u16, verdict: Verdict) {
        match self.line_or_new(host, port, verdict) {
            Some(a) => a.count += 1,
            None => self.dropped += 1,
        }
    }

    pub fn add_bytes(&mut self, host: &str, port: u16, verdict: Verdict, out: u64, inb: u64) {
        match self.line_or_new(host, port, verdict) {
            Some(a) => {
                a.bytes_out += out;
                a.bytes_in += inb;
            }
            None => {
                self.dropped_bytes_out += out;
                self.dropped_bytes_in += inb;
            }
        }
    }

    /// The line of (host, port, verdict), made if there is room for it.
    fn line_or_new(
        &mut self,
        host: &str,
        port: u16,
        verdict: Verdict,
    ) -> Option<&mut EgressAttempt> {
        if let Some(at) = self.position(host, port, verdict) {
            return self.attempts.get_mut(at);
        }
        let refused = self
            .attempts
            .iter()
            .filter(|a| !a.verdict.allowed())
            .count();
        let room = self.attempts.len() < MAX_LOG_ENTRIES
            && (verdict.allowed() || refused < MAX_REFUSED_ENTRIES);
        if !room {
            return None;
        }
        self.attempts.push(EgressAttempt {
            host: cut(host),
            port,
            verdict,
            count: 0,
            bytes_out: 0,
            bytes_in: 0,
        });
        self.attempts.last_mut()
    }

    fn position(&self, host: &str, port: u16, verdict: Verdict) -> Option<usize> {
        let host = cut(host);
        self.attempts
            .iter()
            .position(|a| a.host == host && a.port == port && a.verdict == verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(e: &str) -> EgressError {
        HostPattern::parse(e).expect_err(e)
    }

    #[test]
    fn entries_are_host_names_or_a_star_dot_domain() {
        assert_eq!(
            HostPattern::parse("PyPI.org."),
            Ok(HostPattern::Exact("pypi.org".into()))
        );
        assert_eq!(
            HostPattern::parse("*.npmjs.org"),
            Ok(HostPattern::Under("npmjs.org".into()))
        );
        assert!(matches!(refused("*"), EgressError::Everything(_)));
        assert!(matches!(refused("10.0.0.1"), EgressError::IpLiteral(_)));
        assert!(matches!(refused("::1"), EgressError::IpLiteral(_)));
        assert!(matches!(refused("[::1]"), EgressError::IpLiteral(_)));
        assert!(matches!(refused("1.2.3"), EgressError::IpLiteral(_)));
        assert!(matches!(refused("*.org"), EgressError::TooBroad(_)));
        for bad in [
            "localhost",
            "a.*.org",
            "*foo.org",
            "pypi.org:443",
            "http://pypi.org",
            "-a.org",
            "a..org",
            "pypi.org/simple",
        ] {
            assert!(matches!(refused(bad), EgressError::BadName(_)), "{bad}");
        }
        // The message names the entry.
        assert!(refused("bad_name.org").to_string().contains("bad_name.org"));
    }

    #[test]
    fn a_star_dot_entry_under_a_public_suffix_is_refused_and_one_under_a_domain_is_not() {
        for suffix in [
            "*.github.io",
            "*.co.uk",
            "*.GitHub.IO.",
            "*.s3.amazonaws.com",
        ] {
            let e = refused(suffix);
            assert!(matches!(e, EgressError::PublicSuffix(_)), "{suffix}: {e}");
            assert!(e.to_string().contains(suffix), "{e}");
        }
        // Stored before the rule (or a newer list): still read back.
        assert_eq!(
            AllowList::from_stored("*.github.io,pypi.org").map(|l| l.to_stored()),
            Ok("*.github.io,pypi.org".to_owned())
        );
        for fine in [
            "*.acme.github.io",
            "*.example.co.uk",
            "*.corp.internal",
            "github.io",
            "*.npmjs.org",
        ] {
            assert!(HostPattern::parse(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn a_ceiling_holds_every_entry_to_its_hosts_and_names_the_first_outside() {
        let ceiling = AllowList::parse(&["pypi.org", "*.pythonhosted.org", "*.npmjs.org"]).unwrap();
        for inside in [
            &["pypi.org"][..],
            &["files.pythonhosted.org", "*.pythonhosted.org"],
            &["*.registry.npmjs.org", "registry.npmjs.org"],
        ] {
            let list = AllowList::parse(inside).unwrap();
            assert_eq!(
                list.check_within(&ceiling, "the ceiling"),
                Ok(()),
                "{inside:?}"
            );
        }
        for (asked, outside) in [
            (&["pypi.org", "attacker.example"][..], "attacker.example"),
            (&["*.pypi.org"], "*.pypi.org"),
            (&["pythonhosted.org"], "pythonhosted.org"),
            (&["*.org"], "*.org"),
        ] {
            let Ok(list) = AllowList::parse(asked) else {
                // "*.org" is refused on its own already.
                continue;
            };
            let e = list.check_within(&ceiling, "the ceiling").unwrap_err();
            assert_eq!(
                e,
                EgressError::OutsideCeiling {
                    entry: outside.into(),
                    whose: "the ceiling",
                    ceiling: "pypi.org, *.pythonhosted.org, *.npmjs.org".into(),
                }
            );
            let text = e.to_string();
            assert!(
                text.contains(outside) && text.contains("*.pythonhosted.org"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_star_dot_domain_covers_names_under_it_only() {
        let l = AllowList::parse(&["*.npmjs.org", "pypi.org"]).unwrap();
        assert!(l.allows("registry.npmjs.org"));
        assert!(l.allows("A.B.NPMJS.ORG."));
        assert!(!l.allows("npmjs.org"));
        assert!(!l.allows("evilnpmjs.org"));
        assert!(!l.allows("npmjs.org.evil.com"));
        assert!(l.allows("pypi.org"));
        assert!(!l.allows("files.pypi.org"));
        assert!(!l.allows("pypi.org.evil.com"));
    }

    #[test]
    fn lists_are_capped_and_never_empty() {
        let many: Vec<String> = (0..=MAX_ALLOW_ENTRIES)
            .map(|i| format!("h{i}.example.org"))
            .collect();
        assert_eq!(
            AllowList::parse(&many),
            Err(EgressError::TooMany(MAX_ALLOW_ENTRIES + 1))
        );
        assert_eq!(AllowList::parse::<&str>(&[]), Err(EgressError::Empty));
        let l = AllowList::parse(&["a.org", "A.org", "*.b.org"]).unwrap();
        assert_eq!(l.to_stored(), "a.org,*.b.org");
        assert_eq!(AllowList::from_stored(&l.to_stored()), Ok(l));
    }

    #[test]
    fn the_argument_takes_three_shapes() {
        use serde_json::json;
        assert_eq!(Egress::from_json(&json!("internet")), Ok(Egress::Internet));
        assert_eq!(Egress::from_json(&json!("none")), Ok(Egress::None));
        let allow = Egress::from_json(&json!({"allow": ["pypi.org"]})).unwrap();
        assert_eq!(allow.network(), Network::Allow);
        for e in [Egress::Internet, Egress::None, allow] {
            assert_eq!(Egress::from_json(&e.to_json()), Ok(e));
        }
        for bad in [
            json!("allow"),
            json!("wifi"),
            json!(3),
            json!({"allow": "pypi.org"}),
            json!({"allow": [1]}),
            json!({"deny": ["a.org"]}),
            json!({"allow": ["a.org"], "x": 1}),
        ] {
            assert!(
                matches!(Egress::from_json(&bad), Err(EgressError::Shape(_))),
                "{bad}"
            );
        }
        let long = json!({ "allow": vec![1; 10_000] });
        let e = Egress::from_json(&long).unwrap_err().to_string();
        assert!(e.len() < 600, "{} bytes", e.len());
        assert!(matches!(
            Egress::from_json(&json!({"allow": ["a.org", "*"]})),
            Err(EgressError::Everything(_))
        ));
    }

    #[test]
    fn the_operator_default_reads_as_text() {
        assert_eq!(Egress::from_setting("none"), Ok(Egress::None));
        let e = Egress::from_setting("allow: pypi.org, files.pythonhosted.org").unwrap();
        assert!(e.allow_list().unwrap().allows("files.pythonhosted.org"));
        assert!(Egress::from_setting("allow:").is_err());
        assert!(Egress::from_setting("open").is_err());
    }

    #[test]
    fn the_log_is_bounded_and_sums_by_line() {
        let mut log = EgressLog::default();
        log.record("pypi.org", 443, Verdict::Allowed);
        log.record("pypi.org", 443, Verdict::Allowed);
        log.add_bytes("pypi.org", 443, Verdict::Allowed, 10, 200);
        log.record("evil.org", 443, Verdict::NotAllowed);
        assert_eq!(log.attempts.len(), 2);
        assert_eq!(log.attempts[0].count, 2);
        assert_eq!(log.attempts[0].bytes_in, 200);
        for i in 0..MAX_LOG_ENTRIES + 5 {
            log.record(&format!("h{i}.org"), 443, Verdict::NotAllowed);
        }
        // Refusals take at most their share: allowed attempts still get lines.
        assert_eq!(log.attempts.len(), MAX_REFUSED_ENTRIES + 1);
        assert_eq!(
            log.dropped,
            (MAX_LOG_ENTRIES + 5 - (MAX_REFUSED_ENTRIES - 1)) as u64
        );
        for i in 0..MAX_LOG_ENTRIES {
            log.record(&format!("ok{i}.org"), 443, Verdict::Allowed);
        }
        assert_eq!(log.attempts.len(), MAX_LOG_ENTRIES);
        let dropped = log.dropped;
        log.add_bytes("ok63.org", 443, Verdict::Allowed, 5, 7);
        assert_eq!((log.dropped_bytes_out, log.dropped_bytes_in), (5, 7));
        assert_eq!(log.dropped, dropped);
    }
}
