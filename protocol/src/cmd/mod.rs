//! Typed commands: parsed from request frames, encoded back to frames.
//!
//! One command per file; [`Command::from_frame`] is the one place that
//! dispatches by name. Names and option keywords are case-insensitive;
//! options are keyword-value pairs in any order, each at most once.

mod abandon;
mod admin;
mod claim;
mod cluster;
mod complete;
mod forget;
mod inspect;
mod journal;
mod release;
mod renew;
mod scan;
mod settle;

pub use abandon::Abandon;
pub use admin::{
    AclCmd, Auth, ClientCmd, ClientKill, CommandCmd, ConfigCmd, Echo, Hello, Info, LatencyCmd, Ping,
};
pub use claim::{Claim, OnExpire};
pub use cluster::ClusterCmd;
pub use complete::Complete;
pub use forget::Forget;
pub use inspect::Inspect;
pub use journal::Journal;
pub use release::Release;
pub use renew::Renew;
pub use scan::Scan;
pub use settle::Settle;

use bytes::Bytes;

use crate::error::CommandError;
use crate::frame::{Frame, parse_u64};
use crate::spec::{CommandId, CommandSpec};

/// A request, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// `CLAIM key [LEASE ms] [RETAIN ms] [WAIT ms] [FP bytes] [ONEXPIRE FREE|RECOVER] [ATTEMPT id]`
    Claim(Claim),
    /// `SETTLE key [WAIT ms]`
    Settle(Settle),
    /// `COMPLETE key fence value [RETAIN ms] [ERROR]`
    Complete(Complete),
    /// `RENEW key fence LEASE ms`
    Renew(Renew),
    /// `JOURNAL key fence bytes`
    Journal(Journal),
    /// `RELEASE key fence`
    Release(Release),
    /// `ABANDON key fence`
    Abandon(Abandon),
    /// `INSPECT key`
    Inspect(Inspect),
    /// `FORGET key`
    Forget(Forget),
    /// `PING [message]`
    Ping(Ping),
    /// `ECHO message`
    Echo(Echo),
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`
    Hello(Hello),
    /// `AUTH [user] password`
    Auth(Auth),
    /// `QUIT`
    Quit,
    /// `INFO [section ...]`
    Info(Info),
    /// `DBSIZE`
    DbSize,
    /// `CLIENT ID|SETNAME|GETNAME|LIST|INFO`
    Client(ClientCmd),
    /// `COMMAND [COUNT|DOCS|INFO ...]`
    Command(CommandCmd),
    /// `CONFIG GET pattern ...`
    Config(ConfigCmd),
    /// `CLUSTER INFO|NODES|MYID|SLOTS|SHARDS|KEYSLOT|MEMBERS|ADD|PROMOTE|REMOVE`
    Cluster(ClusterCmd),
    /// `SELECT index` (only database 0 exists)
    Select(u64),
    /// `ACL WHOAMI|LIST|USERS|CAT|LOAD|LOG`
    Acl(AclCmd),
    /// `READONLY`: accepted for Redis Cluster clients that read from
    /// replicas; a follower still redirects every record command and read
    /// to the leader.
    ReadOnly,
    /// `READWRITE`: the counterpart of [`Command::ReadOnly`], accepted
    /// likewise.
    ReadWrite,
    /// `LATENCY LATEST|HISTORY|RESET|HISTOGRAM|HELP`
    Latency(LatencyCmd),
    /// `SCAN cursor [MATCH pattern] [COUNT count]`
    Scan(Scan),
    /// `ROLE`: this node's part in replication, in Redis's shape.
    Role,
}

impl Command {
    /// Parses a request frame (an array of bulk strings).
    pub fn from_frame(frame: Frame) -> Result<Command, CommandError> {
        Command::from_frame_naming(frame).map_err(|(e, _)| e)
    }

    /// [`Command::from_frame`], and with an error the command the request
    /// named, when it names one (a server counts the refusal against it).
    pub fn from_frame_naming(frame: Frame) -> Result<Command, (CommandError, Option<CommandId>)> {
        let Frame::Array(items) = frame else {
            return Err((CommandError::NotAnArray, None));
        };
        if !items
            .iter()
            .all(|f| matches!(f, Frame::Bulk(_) | Frame::Simple(_)))
        {
            return Err((CommandError::NotAnArray, None));
        }
        Command::from_items(items)
    }

    /// Parses a request from its arguments, the command name first.
    pub fn from_args(args: Vec<Bytes>) -> Result<Command, CommandError> {
        Command::from_items(args.into_iter().map(Frame::Bulk).collect()).map_err(|(e, _)| e)
    }

    /// Parses a request from frames already known to be strings; with an
    /// error, the command named if it is one.
    fn from_items(items: Vec<Frame>) -> Result<Command, (CommandError, Option<CommandId>)> {
        let mut it = items.into_iter();
        let name = string(it.next()).ok_or((CommandError::Empty, None))?;
        let Some(spec) = crate::spec::lookup(&name) else {
            return Err((CommandError::Unknown(name), None));
        };
        Command::parse_known(spec.id, it).map_err(|e| (e, Some(spec.id)))
    }

    /// Parses the arguments of command `id`.
    fn parse_known(id: CommandId, it: std::vec::IntoIter<Frame>) -> Result<Command, CommandError> {
        macro_rules! parse {
            ($variant:ident, $ty:ty, $wire:literal) => {
                Command::$variant(<$ty>::parse(&mut Args::new($wire, it))?)
            };
        }
        let cmd = match id {
            CommandId::Ping => parse!(Ping, Ping, "ping"),
            CommandId::Echo => parse!(Echo, Echo, "echo"),
            CommandId::Auth => parse!(Auth, Auth, "auth"),
            CommandId::Quit => {
                Args::new("quit", it).finish()?;
                Command::Quit
            }
            CommandId::Info => parse!(Info, Info, "info"),
            CommandId::Claim => parse!(Claim, Claim, "claim"),
            CommandId::Hello => parse!(Hello, Hello, "hello"),
            CommandId::Settle => parse!(Settle, Settle, "settle"),
            CommandId::Forget => parse!(Forget, Forget, "forget"),
            CommandId::DbSize => {
                Args::new("dbsize", it).finish()?;
                Command::DbSize
            }
            CommandId::Client => parse!(Client, ClientCmd, "client"),
            CommandId::Config => parse!(Config, ConfigCmd, "config"),
            CommandId::Cluster => parse!(Cluster, ClusterCmd, "cluster"),
            CommandId::Renew => parse!(Renew, Renew, "renew"),
            CommandId::Journal => parse!(Journal, Journal, "journal"),
            CommandId::Release => parse!(Release, Release, "release"),
            CommandId::Abandon => parse!(Abandon, Abandon, "abandon"),
            CommandId::Inspect => parse!(Inspect, Inspect, "inspect"),
            CommandId::Command => parse!(Command, CommandCmd, "command"),
            CommandId::Complete => parse!(Complete, Complete, "complete"),
            CommandId::Select => {
                let mut args = Args::new("select", it);
                let index = args.required()?;
                args.finish()?;
                Command::Select(parse_u64(&index).ok_or(CommandError::NotAnInteger("DB index"))?)
            }
            CommandId::Acl => parse!(Acl, AclCmd, "acl"),
            CommandId::Latency => parse!(Latency, LatencyCmd, "latency"),
            CommandId::Scan => parse!(Scan, Scan, "scan"),
            CommandId::Role => {
                Args::new("role", it).finish()?;
                Command::Role
            }
            CommandId::ReadOnly => {
                Args::new("readonly", it).finish()?;
                Command::ReadOnly
            }
            CommandId::ReadWrite => {
                Args::new("readwrite", it).finish()?;
                Command::ReadWrite
            }
        };
        Ok(cmd)
    }

    /// The request frame for this command (what a client sends).
    pub fn to_frame(&self) -> Frame {
        let mut out = Vec::with_capacity(8);
        match self {
            Command::Claim(c) => c.write_args(&mut out),
            Command::Settle(c) => c.write_args(&mut out),
            Command::Complete(c) => c.write_args(&mut out),
            Command::Renew(c) => c.write_args(&mut out),
            Command::Journal(c) => c.write_args(&mut out),
            Command::Release(c) => c.write_args(&mut out),
            Command::Abandon(c) => c.write_args(&mut out),
            Command::Inspect(c) => c.write_args(&mut out),
            Command::Forget(c) => c.write_args(&mut out),
            Command::Ping(c) => c.write_args(&mut out),
            Command::Echo(c) => c.write_args(&mut out),
            Command::Hello(c) => c.write_args(&mut out),
            Command::Auth(c) => c.write_args(&mut out),
            Command::Quit => out.push(word("QUIT")),
            Command::Info(c) => c.write_args(&mut out),
            Command::DbSize => out.push(word("DBSIZE")),
            Command::Client(c) => c.write_args(&mut out),
            Command::Command(c) => c.write_args(&mut out),
            Command::Config(c) => c.write_args(&mut out),
            Command::Cluster(c) => c.write_args(&mut out),
            Command::Select(i) => out.extend([word("SELECT"), num(*i)]),
            Command::Acl(c) => c.write_args(&mut out),
            Command::ReadOnly => out.push(word("READONLY")),
            Command::ReadWrite => out.push(word("READWRITE")),
            Command::Latency(c) => c.write_args(&mut out),
            Command::Scan(c) => c.write_args(&mut out),
            Command::Role => out.push(word("ROLE")),
        }
        Frame::Array(out)
    }

    /// Which command this is.
    pub fn id(&self) -> CommandId {
        match self {
            Command::Claim(_) => CommandId::Claim,
            Command::Settle(_) => CommandId::Settle,
            Command::Complete(_) => CommandId::Complete,
            Command::Renew(_) => CommandId::Renew,
            Command::Journal(_) => CommandId::Journal,
            Command::Release(_) => CommandId::Release,
            Command::Abandon(_) => CommandId::Abandon,
            Command::Inspect(_) => CommandId::Inspect,
            Command::Forget(_) => CommandId::Forget,
            Command::Ping(_) => CommandId::Ping,
            Command::Echo(_) => CommandId::Echo,
            Command::Hello(_) => CommandId::Hello,
            Command::Auth(_) => CommandId::Auth,
            Command::Quit => CommandId::Quit,
            Command::Info(_) => CommandId::Info,
            Command::DbSize => CommandId::DbSize,
            Command::Client(_) => CommandId::Client,
            Command::Command(_) => CommandId::Command,
            Command::Config(_) => CommandId::Config,
            Command::Cluster(_) => CommandId::Cluster,
            Command::Select(_) => CommandId::Select,
            Command::Acl(_) => CommandId::Acl,
            Command::ReadOnly => CommandId::ReadOnly,
            Command::ReadWrite => CommandId::ReadWrite,
            Command::Latency(_) => CommandId::Latency,
            Command::Scan(_) => CommandId::Scan,
            Command::Role => CommandId::Role,
        }
    }

    /// The command's metadata from the command table.
    pub fn spec(&self) -> &'static CommandSpec {
        crate::spec::of(self.id())
    }

    /// The command's name in lower case, as `CLIENT LIST` and metrics show it.
    pub fn name(&self) -> &'static str {
        self.spec().name
    }

    /// The record key the command addresses, if any.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Command::Claim(c) => Some(&c.key),
            Command::Settle(c) => Some(&c.key),
            Command::Complete(c) => Some(&c.key),
            Command::Renew(c) => Some(&c.key),
            Command::Journal(c) => Some(&c.key),
            Command::Release(c) => Some(&c.key),
            Command::Abandon(c) => Some(&c.key),
            Command::Inspect(c) => Some(&c.key),
            Command::Forget(c) => Some(&c.key),
            _ => None,
        }
    }
}

pub(crate) fn word(w: &'static str) -> Frame {
    Frame::Bulk(Bytes::from_static(w.as_bytes()))
}

pub(crate) fn num(n: u64) -> Frame {
    Frame::Bulk(Bytes::from(itoa::Buffer::new().format(n).to_owned()))
}

/// A cursor over a command's arguments.
pub(crate) struct Args {
    cmd: &'static str,
    it: std::vec::IntoIter<Frame>,
}

/// The string a request argument carries (arguments are checked to be
/// strings before parsing starts).
fn string(f: Option<Frame>) -> Option<Bytes> {
    match f? {
        Frame::Bulk(b) | Frame::Simple(b) => Some(b),
        _ => Some(Bytes::new()),
    }
}

impl Args {
    pub(crate) fn new(cmd: &'static str, it: std::vec::IntoIter<Frame>) -> Self {
        Args { cmd, it }
    }

    pub(crate) fn cmd(&self) -> &'static str {
        self.cmd
    }

    /// The next argument, if any.
    pub(crate) fn next(&mut self) -> Option<Bytes> {
        string(self.it.next())
    }

    /// The next argument; its absence is an arity error.
    pub(crate) fn required(&mut self) -> Result<Bytes, CommandError> {
        string(self.it.next()).ok_or(CommandError::WrongArity(self.cmd))
    }

    /// The next argument as a whole number of milliseconds or a fence.
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, CommandError> {
        let arg = self.required()?;
        parse_u64(&arg).ok_or(CommandError::NotAnInteger(what))
    }

    /// The value of option `opt`, which must not have been seen yet.
    pub(crate) fn option_value(
        &mut self,
        opt: &'static str,
        seen: bool,
    ) -> Result<Bytes, CommandError> {
        if seen {
            return Err(CommandError::DuplicateOption(opt));
        }
        string(self.it.next()).ok_or(CommandError::MissingValue(opt))
    }

    /// The value of option `opt` as milliseconds.
    pub(crate) fn option_ms(&mut self, opt: &'static str, seen: bool) -> Result<u64, CommandError> {
        let v = self.option_value(opt, seen)?;
        parse_u64(&v).ok_or(CommandError::NotAnInteger(opt))
    }

    /// The arguments left, in order.
    pub(crate) fn rest(&mut self) -> Vec<Bytes> {
        self.it.by_ref().filter_map(|f| string(Some(f))).collect()
    }

    /// Errors if arguments are left over (borrowing form).
    pub(crate) fn finish_ref(&mut self) -> Result<(), CommandError> {
        match self.it.next() {
            None => Ok(()),
            Some(_) => Err(CommandError::WrongArity(self.cmd)),
        }
    }

    /// Errors if arguments are left over.
    pub(crate) fn finish(mut self) -> Result<(), CommandError> {
        match self.it.next() {
            None => Ok(()),
            Some(_) => Err(CommandError::WrongArity(self.cmd)),
        }
    }

    /// A fence argument: a positive integer.
    pub(crate) fn fence(&mut self) -> Result<u64, CommandError> {
        match self.u64("fence")? {
            0 => Err(CommandError::NotAnInteger("fence")),
            f => Ok(f),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
