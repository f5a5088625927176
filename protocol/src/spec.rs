//! The command table: every command's name, arity, flags and key position,
//! in one list. The parser finds commands here; `COMMAND`, metrics labels,
//! and read/write routing (and later ACL categories) read it.

/// Which command a [`CommandSpec`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CommandId {
    /// `CLAIM`
    Claim,
    /// `SETTLE`
    Settle,
    /// `COMPLETE`
    Complete,
    /// `RENEW`
    Renew,
    /// `JOURNAL`
    Journal,
    /// `RELEASE`
    Release,
    /// `ABANDON`
    Abandon,
    /// `INSPECT`
    Inspect,
    /// `FORGET`
    Forget,
    /// `PING`
    Ping,
    /// `ECHO`
    Echo,
    /// `HELLO`
    Hello,
    /// `AUTH`
    Auth,
    /// `QUIT`
    Quit,
    /// `INFO`
    Info,
    /// `DBSIZE`
    DbSize,
    /// `CLIENT`
    Client,
    /// `COMMAND`
    Command,
    /// `CONFIG`
    Config,
    /// `CLUSTER`
    Cluster,
    /// `SELECT`
    Select,
    /// `ACL`
    Acl,
    /// `READONLY`
    ReadOnly,
    /// `READWRITE`
    ReadWrite,
    /// `LATENCY`
    Latency,
    /// `SCAN`
    Scan,
    /// `ROLE`
    Role,
}

/// Command flags (a bit set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags(u8);

impl Flags {
    /// Changes the store (goes through the engine's log).
    pub const WRITE: Flags = Flags(1);
    /// Reads the store without changing it.
    pub const READ: Flags = Flags(1 << 1);
    /// Administrative (server state, every key).
    pub const ADMIN: Flags = Flags(1 << 2);
    /// May block the connection (WAIT).
    pub const BLOCKING: Flags = Flags(1 << 3);
    /// About the connection itself.
    pub const CONNECTION: Flags = Flags(1 << 4);

    const fn or(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }

    /// Whether every flag of `o` is set.
    pub const fn contains(self, o: Flags) -> bool {
        self.0 & o.0 == o.0
    }

    /// The flag names `COMMAND` shows, in Redis's spelling where Redis has
    /// one.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        [
            (Flags::WRITE, "write"),
            (Flags::READ, "readonly"),
            (Flags::ADMIN, "admin"),
            (Flags::BLOCKING, "blocking"),
            (Flags::CONNECTION, "fast"),
        ]
        .into_iter()
        .filter(move |(f, _)| self.contains(*f))
        .map(|(_, n)| n)
    }
}

/// One command's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandSpec {
    /// Which command.
    pub id: CommandId,
    /// The name, lower case.
    pub name: &'static str,
    /// Arity in the `COMMAND` convention, counting the name: `n` exactly
    /// `n` arguments, `-n` at least `n`.
    pub arity: i64,
    /// Flags.
    pub flags: Flags,
    /// Position of the key among the arguments (the name is 0); 0 if the
    /// command takes no key. Commands take at most one key.
    pub key_pos: u8,
}

const fn spec(
    id: CommandId,
    name: &'static str,
    arity: i64,
    flags: Flags,
    key_pos: u8,
) -> CommandSpec {
    CommandSpec {
        id,
        name,
        arity,
        flags,
        key_pos,
    }
}

const W: Flags = Flags::WRITE;
const R: Flags = Flags::READ;
const A: Flags = Flags::ADMIN;
const B: Flags = Flags::BLOCKING;
const C: Flags = Flags::CONNECTION;

/// Every command the server knows, in the order `COMMAND` lists them.
pub const COMMANDS: &[CommandSpec] = &[
    spec(CommandId::Claim, "claim", -2, W.or(B), 1),
    spec(CommandId::Settle, "settle", -2, R.or(B), 1),
    spec(CommandId::Complete, "complete", -4, W, 1),
    spec(CommandId::Renew, "renew", 5, W, 1),
    spec(CommandId::Journal, "journal", 4, W, 1),
    spec(CommandId::Release, "release", 3, W, 1),
    spec(CommandId::Abandon, "abandon", 3, W, 1),
    spec(CommandId::Inspect, "inspect", 2, R, 1),
    spec(CommandId::Forget, "forget", 2, W.or(A), 1),
    spec(CommandId::Ping, "ping", -1, C, 0),
    spec(CommandId::Echo, "echo", 2, C, 0),
    spec(CommandId::Hello, "hello", -1, C, 0),
    spec(CommandId::Auth, "auth", -2, C, 0),
    spec(CommandId::Quit, "quit", 1, C, 0),
    spec(CommandId::Info, "info", -1, A, 0),
    spec(CommandId::DbSize, "dbsize", 1, A, 0),
    spec(CommandId::Client, "client", -2, C, 0),
    spec(CommandId::Command, "command", -1, C, 0),
    spec(CommandId::Config, "config", -2, A, 0),
    spec(CommandId::Cluster, "cluster", -2, A, 0),
    spec(CommandId::Select, "select", 2, C, 0),
    spec(CommandId::Acl, "acl", -2, A, 0),
    spec(CommandId::ReadOnly, "readonly", 1, C, 0),
    spec(CommandId::ReadWrite, "readwrite", 1, C, 0),
    spec(CommandId::Latency, "latency", -2, A, 0),
    spec(CommandId::Scan, "scan", -2, R, 0),
    spec(CommandId::Role, "role", 1, A, 0),
];

/// The spec of the command named `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS
        .iter()
        .find(|s| s.name.len() == name.len() && s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// The spec of `id`.
pub fn of(id: CommandId) -> &'static CommandSpec {
    // The table lists the ids in declaration order (checked by a test).
    &COMMANDS[id as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_id_order_and_names_are_unique() {
        for (i, s) in COMMANDS.iter().enumerate() {
            assert_eq!(s.id as usize, i, "{} out of place", s.name);
            assert_eq!(lookup(s.name.to_uppercase().as_bytes()), Some(s));
            assert_eq!(of(s.id), s);
        }
        let mut names: Vec<_> = COMMANDS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COMMANDS.len());
    }
}
