//! Users and what they may do: a subset of Redis's ACL rules, so that
//! operators reuse what they know.
//!
//! A user is defined by one rule line, `user NAME rule ...`, applied left
//! to right from nothing allowed (as in Redis, a new user starts `off`,
//! with no password, no keys and no commands):
//!
//! - `on` / `off`: whether the user may authenticate;
//! - `>password` / `<password` add / remove a password (kept only as its
//!   SHA-256); `#hex` / `!hex` add / remove a SHA-256 given in hex;
//!   `nopass` (any password is accepted); `resetpass`;
//! - `~pattern` (read and write), `%R~pattern`, `%W~pattern`, `%RW~pattern`
//!   key globs (`*`, `?`, `[a-z]`, `[^a]`, `\x`); `allkeys` (`~*`);
//!   `resetkeys`;
//! - `+@category` / `-@category`, `+command` / `-command`,
//!   `+command|sub` / `-command|sub`, `allcommands` (`+@all`),
//!   `nocommands` (`-@all`);
//! - `reset`: back to nothing allowed.
//!
//! `AUTH`, `HELLO` and `QUIT` are always allowed. A wait (`WAIT` above 0)
//! needs `@blocking` besides the command itself.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;

use idem_protocol::Command;
use idem_protocol::cmd::{AclCmd, ClientCmd, ClusterCmd, ConfigCmd};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The category bits.
mod cat {
    pub(super) const KEYSPACE: u32 = 1;
    pub(super) const READ: u32 = 1 << 1;
    pub(super) const WRITE: u32 = 1 << 2;
    pub(super) const ADMIN: u32 = 1 << 3;
    pub(super) const DANGEROUS: u32 = 1 << 4;
    pub(super) const CONNECTION: u32 = 1 << 5;
    pub(super) const BLOCKING: u32 = 1 << 6;
    pub(super) const FAST: u32 = 1 << 7;
    pub(super) const SLOW: u32 = 1 << 8;
    pub(super) const IDEM: u32 = 1 << 9;
}

/// Category names. The Redis categories without Idem commands (data
/// types, pub/sub, scripting, transactions) are accepted and grant
/// nothing, so rule lines written for Redis load unchanged.
pub const CATEGORIES: &[(&str, u32)] = &[
    ("keyspace", cat::KEYSPACE),
    ("read", cat::READ),
    ("write", cat::WRITE),
    ("admin", cat::ADMIN),
    ("dangerous", cat::DANGEROUS),
    ("connection", cat::CONNECTION),
    ("blocking", cat::BLOCKING),
    ("fast", cat::FAST),
    ("slow", cat::SLOW),
    ("idem", cat::IDEM),
    ("string", 0),
    ("list", 0),
    ("set", 0),
    ("sortedset", 0),
    ("hash", 0),
    ("bitmap", 0),
    ("hyperloglog", 0),
    ("geo", 0),
    ("stream", 0),
    ("pubsub", 0),
    ("transaction", 0),
    ("scripting", 0),
];

/// One permission: a command, or one subcommand of a command with
/// subcommands (`client|list`).
struct Unit {
    name: &'static str,
    cats: u32,
}

const fn unit(name: &'static str, cats: u32) -> Unit {
    Unit { name, cats }
}

use cat::*;

/// The record commands' categories.
const IDEM_W: u32 = WRITE | IDEM | FAST;
const IDEM_R: u32 = READ | IDEM | FAST;
const CONN: u32 = CONNECTION | FAST;

/// Every permission; a user's commands are a bit set over this table.
/// The last bit ([`WAIT`]) is not a command: it is the right to wait.
const UNITS: &[Unit] = &[
    unit("claim", IDEM_W),
    unit("settle", IDEM_R),
    unit("complete", IDEM_W),
    unit("renew", IDEM_W),
    unit("journal", IDEM_W),
    unit("release", IDEM_W),
    unit("abandon", IDEM_W),
    unit("inspect", IDEM_R),
    unit("forget", WRITE | KEYSPACE | ADMIN | DANGEROUS | SLOW),
    unit("ping", CONN),
    unit("echo", CONN),
    unit("select", CONN),
    unit("readonly", CONN),
    unit("readwrite", CONN),
    unit("command", CONNECTION | SLOW),
    unit("client|id", CONN),
    unit("client|setname", CONNECTION | SLOW),
    unit("client|getname", CONNECTION | SLOW),
    unit("client|info", CONNECTION | SLOW),
    unit("client|setinfo", CONNECTION | SLOW),
    unit("client|list", ADMIN | DANGEROUS | SLOW),
    unit("client|kill", ADMIN | DANGEROUS | SLOW),
    unit("info", ADMIN | DANGEROUS | SLOW),
    unit("dbsize", ADMIN | SLOW),
    unit("config|get", ADMIN | DANGEROUS | SLOW),
    unit("config|reload-tls", ADMIN | DANGEROUS | SLOW),
    unit("config|resetstat", ADMIN | DANGEROUS | SLOW),
    unit("latency", ADMIN | DANGEROUS | SLOW),
    unit("scan", READ | KEYSPACE | SLOW),
    unit("role", ADMIN | DANGEROUS | FAST),
    unit("cluster|info", CONNECTION | SLOW),
    unit("cluster|nodes", CONNECTION | SLOW),
    unit("cluster|myid", CONNECTION | SLOW),
    unit("cluster|slots", CONNECTION | SLOW),
    unit("cluster|shards", CONNECTION | SLOW),
    unit("cluster|keyslot", CONNECTION | SLOW),
    unit("cluster|members", ADMIN | SLOW),
    unit("cluster|add", ADMIN | DANGEROUS | SLOW),
    unit("cluster|promote", ADMIN | DANGEROUS | SLOW),
    unit("cluster|remove", ADMIN | DANGEROUS | SLOW),
    unit("acl|whoami", CONNECTION | SLOW),
    unit("acl|cat", CONNECTION | SLOW),
    unit("acl|users", ADMIN | DANGEROUS | SLOW),
    unit("acl|list", ADMIN | DANGEROUS | SLOW),
    unit("acl|load", ADMIN | DANGEROUS | SLOW),
    unit("acl|log", ADMIN | DANGEROUS | SLOW),
];

/// The bit of the right to wait (`@blocking`).
const WAIT: u32 = 63;

const fn bit(i: usize) -> u64 {
    1 << i
}

fn units_of_category(c: u32) -> u64 {
    let mut set = 0;
    for (i, u) in UNITS.iter().enumerate() {
        if u.cats & c != 0 {
            set |= bit(i);
        }
    }
    if c & BLOCKING != 0 {
        set |= 1 << WAIT;
    }
    set
}

fn all_units() -> u64 {
    ((1u64 << UNITS.len()) - 1) | (1 << WAIT)
}

/// The permission a command needs (`None`: always allowed).
fn unit_of(cmd: &Command) -> Option<usize> {
    let name = match cmd {
        Command::Auth(_) | Command::Hello(_) | Command::Quit => return None,
        Command::Client(c) => match c {
            ClientCmd::Id => "client|id",
            ClientCmd::SetName(_) => "client|setname",
            ClientCmd::GetName => "client|getname",
            ClientCmd::Info => "client|info",
            ClientCmd::SetInfo { .. } => "client|setinfo",
            ClientCmd::List => "client|list",
            ClientCmd::Kill(_) => "client|kill",
            _ => "client|list",
        },
        Command::Config(ConfigCmd::Get(_)) => "config|get",
        Command::Config(ConfigCmd::ResetStat) => "config|resetstat",
        Command::Config(_) => "config|reload-tls",
        Command::Cluster(c) => match c {
            ClusterCmd::Info => "cluster|info",
            ClusterCmd::Nodes => "cluster|nodes",
            ClusterCmd::MyId => "cluster|myid",
            ClusterCmd::Slots => "cluster|slots",
            ClusterCmd::Shards => "cluster|shards",
            ClusterCmd::KeySlot(_) => "cluster|keyslot",
            ClusterCmd::Members => "cluster|members",
            ClusterCmd::Add { .. } => "cluster|add",
            ClusterCmd::Promote(_) => "cluster|promote",
            _ => "cluster|remove",
        },
        Command::Acl(c) => match c {
            AclCmd::WhoAmI => "acl|whoami",
            AclCmd::Cat(_) => "acl|cat",
            AclCmd::Users => "acl|users",
            AclCmd::List => "acl|list",
            AclCmd::Load => "acl|load",
            _ => "acl|log",
        },
        other => other.name(),
    };
    UNITS.iter().position(|u| u.name == name)
}

/// Key access a pattern grants.
const KEY_READ: u8 = 1;
const KEY_WRITE: u8 = 2;

/// One element of a compiled key glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Byte(u8),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
}

/// A compiled key glob, Redis's syntax: `*`, `?`, `[abc]`, `[^a-z]`, `\x`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: Vec<u8>,
    toks: Vec<Tok>,
}

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &[u8]) -> Glob {
        let mut toks = Vec::new();
        let mut i = 0;
        while i < pattern.len() {
            let c = pattern[i];
            i += 1;
            match c {
                b'*' => {
                    if toks.last() != Some(&Tok::Star) {
                        toks.push(Tok::Star);
                    }
                }
                b'?' => toks.push(Tok::Any),
                b'\\' if i < pattern.len() => {
                    toks.push(Tok::Byte(pattern[i]));
                    i += 1;
                }
                b'[' => {
                    let negated = pattern.get(i) == Some(&b'^');
                    if negated {
                        i += 1;
                    }
                    let mut ranges = Vec::new();
                    // As in Redis, an unclosed class runs to the end.
                    while i < pattern.len() && pattern[i] != b']' {
                        let mut lo = pattern[i];
                        if lo == b'\\' && i + 1 < pattern.len() {
                            i += 1;
                            lo = pattern[i];
                        }
                        if pattern.get(i + 1) == Some(&b'-')
                            && i + 2 < pattern.len()
                            && pattern[i + 2] != b']'
                        {
                            let hi = pattern[i + 2];
                            ranges.push((lo.min(hi), lo.max(hi)));
                            i += 3;
                        } else {
                            ranges.push((lo, lo));
                            i += 1;
                        }
                    }
                    i += 1;
                    toks.push(Tok::Class { negated, ranges });
                }
                c => toks.push(Tok::Byte(c)),
            }
        }
        Glob {
            source: pattern.to_vec(),
            toks,
        }
    }

    /// Whether `text` matches. Time is at most the product of the two
    /// lengths (one star is backtracked at a time), whatever the input.
    pub fn matches(&self, text: &[u8]) -> bool {
        // `*` (allkeys, every default user): no walk over the key.
        if let [Tok::Star] = self.toks[..] {
            return true;
        }
        let one = |t: &Tok, c: u8| match t {
            Tok::Byte(b) => *b == c,
            Tok::Any => true,
            Tok::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c)) != *negated
            }
            Tok::Star => false,
        };
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.toks.get(p) {
                Some(Tok::Star) => {
                    star = Some((p, t));
                    p += 1;
                }
                Some(tok) if one(tok, text[t]) => {
                    p += 1;
                    t += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        p = sp + 1;
                        t = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        self.toks[p..].iter().all(|t| *t == Tok::Star)
    }

    /// The pattern as written.
    pub fn source(&self) -> &[u8] {
        &self.source
    }
}

/// A user: whether it may log in, its passwords, keys and commands.
#[derive(Debug, Clone)]
pub struct User {
    name: String,
    enabled: bool,
    nopass: bool,
    passwords: Vec<[u8; 32]>,
    keys: Vec<(u8, Glob)>,
    commands: u64,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The command (or subcommand) is not allowed.
    Command(&'static str),
    /// The command is allowed, but not with `WAIT` above 0 (`@blocking`).
    Wait(&'static str),
    /// The key is outside the user's patterns.
    Key,
}

impl User {
    fn empty(name: &str) -> User {
        User {
            name: name.to_owned(),
            enabled: false,
            nopass: false,
            passwords: Vec::new(),
            keys: Vec::new(),
            commands: 0,
        }
    }

    /// The built-in default user: every command on every key, with a
    /// password if `requirepass` gives one.
    fn builtin_default(password: Option<[u8; 32]>) -> User {
        User {
            name: "default".into(),
            enabled: true,
            nopass: password.is_none(),
            passwords: password.into_iter().collect(),
            keys: vec![(KEY_READ | KEY_WRITE, Glob::new(b"*"))],
            commands: all_units(),
        }
    }

    /// The user's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the user may authenticate.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether every way into `before` (the same user as it was) still
    /// lets one in as `self`: no password removed, `nopass` not revoked.
    /// (A connection does not remember which password it gave.)
    pub fn keeps_credentials_of(&self, before: &User) -> bool {
        self.nopass
            || (!before.nopass && before.passwords.iter().all(|p| self.passwords.contains(p)))
    }

    /// Whether any password is accepted (`nopass`).
    pub fn nopass(&self) -> bool {
        self.nopass
    }

    /// Applies one rule.
    fn apply(&mut self, rule: &str) -> Result<(), String> {
        let lower = rule.to_ascii_lowercase();
        match lower.as_str() {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "allkeys" => self.keys = vec![(KEY_READ | KEY_WRITE, Glob::new(b"*"))],
            "resetkeys" => self.keys.clear(),
            "allcommands" => self.commands = all_units(),
            "nocommands" => self.commands = 0,
            "resetchannels" | "allchannels" => {}
            "reset" => *self = User::empty(&self.name),
            _ => return self.apply_prefixed(rule),
        }
        Ok(())
    }

    fn apply_prefixed(&mut self, rule: &str) -> Result<(), String> {
        if let Some(pw) = rule.strip_prefix('>') {
            let h: [u8; 32] = Sha256::digest(pw.as_bytes()).into();
            if !self.passwords.contains(&h) {
                self.passwords.push(h);
            }
            self.nopass = false;
        } else if let Some(pw) = rule.strip_prefix('<') {
            let h: [u8; 32] = Sha256::digest(pw.as_bytes()).into();
            self.passwords.retain(|p| *p != h);
        } else if let Some(hex) = rule.strip_prefix('#') {
            let h = parse_sha256(hex)?;
            if !self.passwords.contains(&h) {
                self.passwords.push(h);
            }
            self.nopass = false;
        } else if let Some(hex) = rule.strip_prefix('!') {
            let h = parse_sha256(hex)?;
            self.passwords.retain(|p| *p != h);
        } else if let Some(p) = rule.strip_prefix('~') {
            self.add_keys(KEY_READ | KEY_WRITE, p);
        } else if let Some(rest) = rule.strip_prefix('%') {
            let (perm, p) = rest
                .split_once('~')
                .ok_or_else(|| format!("'{rule}': a key permission is %R~, %W~ or %RW~"))?;
            let mut access = 0;
            for c in perm.chars() {
                access |= match c.to_ascii_uppercase() {
                    'R' => KEY_READ,
                    'W' => KEY_WRITE,
                    _ => return Err(format!("'{rule}': a key permission is %R~, %W~ or %RW~")),
                };
            }
            if access == 0 {
                return Err(format!("'{rule}': a key permission is %R~, %W~ or %RW~"));
            }
            self.add_keys(access, p);
        } else if rule.starts_with('&') {
            // Channels: Idem has none.
        } else if let Some(c) = rule.strip_prefix("+@") {
            self.commands |= category(c)?;
        } else if let Some(c) = rule.strip_prefix("-@") {
            self.commands &= !category(c)?;
        } else if let Some(c) = rule.strip_prefix('+') {
            self.commands |= command_units(c)?;
        } else if let Some(c) = rule.strip_prefix('-') {
            self.commands &= !command_units(c)?;
        } else {
            return Err(format!("'{rule}': unknown rule"));
        }
        Ok(())
    }

    fn add_keys(&mut self, access: u8, pattern: &str) {
        if let Some(k) = self
            .keys
            .iter_mut()
            .find(|(_, g)| g.source() == pattern.as_bytes())
        {
            k.0 |= access;
        } else {
            self.keys.push((access, Glob::new(pattern.as_bytes())));
        }
    }

    /// Whether `password` is one of the user's (every stored hash is
    /// compared in constant time).
    fn password_matches(&self, password: &[u8]) -> bool {
        if self.nopass {
            return true;
        }
        let got: [u8; 32] = Sha256::digest(password).into();
        let mut ok = subtle::Choice::from(0);
        for want in &self.passwords {
            ok |= want.ct_eq(&got);
        }
        ok.into()
    }

    /// Whether the user may use `key` for `access` (`KEY_READ`/`KEY_WRITE`).
    fn key_allowed(&self, key: &[u8], access: u8) -> bool {
        self.keys
            .iter()
            .any(|(a, g)| a & access == access && g.matches(key))
    }

    /// Whether the user may run `cmd`: the command, a wait (`@blocking`)
    /// and the key.
    pub fn check(&self, cmd: &Command) -> Result<(), Denied> {
        let Some(u) = unit_of(cmd) else {
            return Ok(());
        };
        if self.commands & bit(u) == 0 {
            return Err(Denied::Command(UNITS[u].name));
        }
        let wait = match cmd {
            Command::Claim(c) => c.wait_ms.unwrap_or(0),
            Command::Settle(s) => s.wait_ms.unwrap_or(0),
            _ => 0,
        };
        if wait > 0 && self.commands & (1 << WAIT) == 0 {
            return Err(Denied::Wait(UNITS[u].name));
        }
        if let Some(key) = cmd.key() {
            // CLAIM writes, and reads: it answers a completed key's value.
            let access = match cmd {
                Command::Claim(_) => KEY_READ | KEY_WRITE,
                _ if UNITS[u].cats & READ != 0 => KEY_READ,
                _ => KEY_WRITE,
            };
            if !self.key_allowed(key, access) {
                return Err(Denied::Key);
            }
        }
        Ok(())
    }

    /// Whether a `*` pattern grants the user read access to every key.
    pub fn reads_every_key(&self) -> bool {
        self.keys
            .iter()
            .any(|(a, g)| a & KEY_READ == KEY_READ && g.source() == b"*")
    }

    /// Whether a pattern grants the user read access to `key` (`SCAN`
    /// lists only such keys).
    pub fn may_read(&self, key: &[u8]) -> bool {
        self.key_allowed(key, KEY_READ)
    }

    /// Whether the user may act as an owner of `key`: some `@write`
    /// command is allowed and a pattern grants write access to the key.
    /// `INSPECT` shows the fence and attempt id only to such users.
    pub fn may_own(&self, key: &[u8]) -> bool {
        self.commands & units_of_category(WRITE) != 0 && self.key_allowed(key, KEY_WRITE)
    }

    /// The user as a rule line (`ACL LIST`): passwords as hashes.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "user {} {}",
            self.name,
            if self.enabled { "on" } else { "off" }
        );
        if self.nopass {
            s.push_str(" nopass");
        }
        for p in &self.passwords {
            s.push_str(" #");
            for b in p {
                let _ = write!(s, "{b:02x}");
            }
        }
        if self.keys.is_empty() {
            s.push_str(" resetkeys");
        }
        for (access, g) in &self.keys {
            let pat = String::from_utf8_lossy(g.source());
            match *access {
                a if a == KEY_READ | KEY_WRITE => {
                    let _ = write!(s, " ~{pat}");
                }
                KEY_READ => {
                    let _ = write!(s, " %R~{pat}");
                }
                _ => {
                    let _ = write!(s, " %W~{pat}");
                }
            }
        }
        if self.commands == all_units() {
            s.push_str(" +@all");
        } else {
            s.push_str(" -@all");
            for (i, u) in UNITS.iter().enumerate() {
                if self.commands & bit(i) != 0 {
                    let _ = write!(s, " +{}", u.name);
                }
            }
            if self.commands & (1 << WAIT) != 0 {
                s.push_str(" +@blocking");
            }
        }
        s
    }
}

fn parse_sha256(hex: &str) -> Result<[u8; 32], String> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("a password hash is 64 hex digits (its SHA-256)".into());
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn category(name: &str) -> Result<u64, String> {
    if name.eq_ignore_ascii_case("all") {
        return Ok(all_units());
    }
    CATEGORIES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|&(_, c)| units_of_category(c))
        .ok_or_else(|| format!("unknown category '@{name}' (ACL CAT lists them)"))
}

/// The units a `+name` / `+name|sub` rule names.
fn command_units(name: &str) -> Result<u64, String> {
    let name = name.to_ascii_lowercase();
    let mut set = 0;
    for (i, u) in UNITS.iter().enumerate() {
        let whole = u.name.split('|').next() == Some(name.as_str());
        if u.name == name || whole {
            set |= bit(i);
        }
    }
    if matches!(name.as_str(), "auth" | "hello" | "quit") {
        // Always allowed; accepted so Redis rule lines load.
        return Ok(set);
    }
    if set == 0 {
        return Err(format!("unknown command '{name}'"));
    }
    Ok(set)
}

/// The commands of a category, for `ACL CAT name`.
pub fn category_commands(name: &str) -> Option<Vec<&'static str>> {
    let set = category(name).ok()?;
    Some(
        UNITS
            .iter()
            .enumerate()
            .filter(|(i, _)| set & bit(*i) != 0)
            .map(|(_, u)| u.name)
            .collect(),
    )
}

/// Every category name, for `ACL CAT`.
pub fn category_names() -> impl Iterator<Item = &'static str> {
    CATEGORIES.iter().map(|(n, _)| *n)
}

/// The users of a server.
#[derive(Debug, Clone)]
pub struct Acl {
    users: BTreeMap<String, Arc<User>>,
}

impl Acl {
    /// Builds the users from rule lines (`user NAME rules...`, the `user`
    /// word optional), each with where it came from for errors. The
    /// default user is `requirepass`'s unless a line defines `default`.
    pub fn build<'a>(
        password: Option<[u8; 32]>,
        lines: impl IntoIterator<Item = (String, &'a str)>,
    ) -> Result<Acl, String> {
        let mut users = BTreeMap::new();
        for (origin, line) in lines {
            let mut words = line.split_whitespace();
            let mut first = words.next();
            if first == Some("user") {
                first = words.next();
            }
            let Some(name) = first else {
                return Err(format!("{origin}: a rule line names a user"));
            };
            if name.bytes().any(|b| !b.is_ascii_graphic()) {
                return Err(format!("{origin}: user name '{name}' is not printable"));
            }
            let mut user = User::empty(name);
            for rule in words {
                user.apply(rule)
                    .map_err(|e| format!("{origin}: user {name}: {e}"))?;
            }
            if users.insert(name.to_owned(), Arc::new(user)).is_some() {
                return Err(format!("{origin}: user '{name}' is defined twice"));
            }
        }
        if users.contains_key("default") && password.is_some() {
            return Err(
                "requirepass and a rule for the user 'default' both define the default user: keep one"
                    .into(),
            );
        }
        users
            .entry("default".into())
            .or_insert_with(|| Arc::new(User::builtin_default(password)));
        Ok(Acl { users })
    }

    /// Reads an ACL file's rule lines (`#` comments and blank lines
    /// skipped), for [`Acl::build`].
    pub fn read_file(path: &std::path::Path) -> Result<Vec<(String, String)>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read ACL file {}: {e}", path.display()))?;
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !line.starts_with("user ") {
                return Err(format!(
                    "{}:{}: a line must start with 'user'",
                    path.display(),
                    i + 1
                ));
            }
            lines.push((format!("{}:{}", path.display(), i + 1), line.to_owned()));
        }
        Ok(lines)
    }

    /// A user by name.
    pub fn user(&self, name: &str) -> Option<&Arc<User>> {
        self.users.get(name)
    }

    /// The default user (always defined, maybe off).
    pub fn default_user(&self) -> &Arc<User> {
        &self.users["default"]
    }

    /// The user a new connection starts as: `default` when it is on and
    /// takes no password; otherwise none (the connection must AUTH).
    pub fn initial_user(&self) -> Option<Arc<User>> {
        let d = self.default_user();
        (d.enabled && d.nopass).then(|| Arc::clone(d))
    }

    /// Whether anyone can use the server without knowing a password: some
    /// user that is on takes any (`nopass`; the default user with no
    /// `requirepass` is one). Protected mode then refuses other hosts.
    pub fn open(&self) -> bool {
        self.users.values().any(|u| u.enabled && u.nopass)
    }

    /// The user `name` (`None`: the default user) if it is on and
    /// `password` is one of its own.
    pub fn authenticate(&self, name: Option<&[u8]>, password: &[u8]) -> Option<Arc<User>> {
        let name = std::str::from_utf8(name.unwrap_or(b"default")).ok()?;
        let user = self.users.get(name)?;
        (user.enabled && user.password_matches(password)).then(|| Arc::clone(user))
    }

    /// Every user, by name.
    pub fn users(&self) -> impl Iterator<Item = &Arc<User>> {
        self.users.values()
    }
}

/// What an `ACL LOG` entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// `command`, `key` or `auth`.
    pub reason: &'static str,
    /// The command (`client|list`), the key, or `AUTH`.
    pub object: String,
    /// The user refused (or who tried to authenticate).
    pub username: String,
    /// The client's `CLIENT LIST` line.
    pub client_info: String,
}

/// One `ACL LOG` entry: a denial and how often it recurred.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// The denial.
    pub denial: Denial,
    /// How many times it happened (repeats within 60 s are folded).
    pub count: u64,
    /// Its id, increasing.
    pub entry_id: u64,
    /// When it was first logged, ms since the Unix epoch.
    pub created_ms: u64,
    /// When it was last logged, ms since the Unix epoch.
    pub updated_ms: u64,
}

/// The latest denials (`ACL LOG`), at most [`ACL_LOG_LEN`].
#[derive(Debug, Default)]
pub struct AclLog {
    entries: VecDeque<LogEntry>,
    next_id: u64,
}

/// Entries `ACL LOG` keeps (Redis's `acllog-max-len` default).
pub const ACL_LOG_LEN: usize = 128;

/// The longest text an `ACL LOG` entry keeps of its object, user name and
/// client line; longer ones are cut (and say so). A denied key or a failed
/// AUTH's user name can be as large as a frame: kept whole, 128 entries
/// of them pinned hundreds of MB outside every memory budget.
pub const ACL_LOG_FIELD_BYTES: usize = 512;

/// `text` cut to [`ACL_LOG_FIELD_BYTES`] (at a character boundary), with a
/// note of its length.
fn clip(text: &mut String) {
    if text.len() <= ACL_LOG_FIELD_BYTES {
        return;
    }
    let full = text.len();
    let mut end = ACL_LOG_FIELD_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("...({full} bytes)"));
}

impl AclLog {
    /// Logs a denial at `now_ms`: a repeat of a recent one is counted on it.
    pub fn add(&mut self, mut denial: Denial, now_ms: u64) {
        clip(&mut denial.object);
        clip(&mut denial.username);
        clip(&mut denial.client_info);
        if let Some(e) = self.entries.iter_mut().find(|e| {
            now_ms.saturating_sub(e.updated_ms) < 60_000
                && e.denial.reason == denial.reason
                && e.denial.object == denial.object
                && e.denial.username == denial.username
        }) {
            e.count += 1;
            e.updated_ms = now_ms;
            e.denial.client_info = denial.client_info;
            return;
        }
        if self.entries.len() == ACL_LOG_LEN {
            self.entries.pop_back();
        }
        self.entries.push_front(LogEntry {
            denial,
            count: 1,
            entry_id: self.next_id,
            created_ms: now_ms,
            updated_ms: now_ms,
        });
        self.next_id += 1;
    }

    /// The latest `n` entries, newest first.
    pub fn latest(&self, n: usize) -> impl Iterator<Item = &LogEntry> {
        self.entries.iter().take(n)
    }

    /// Forgets every entry.
    pub fn reset(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests;
