//! Typed commands: parsed from request frames, encoded back to frames.
//!
//! One command per file; [`Command::from_frame`] is the one place that
//! dispatches by name. Names and option keywords are case-insensitive;
//! options are keyword-value pairs in any order, each at most once.

mod abandon;
mod admin;
mod claim;
mod complete;
mod forget;
mod inspect;
mod journal;
mod release;
mod renew;
mod settle;

pub use abandon::Abandon;
pub use admin::{Auth, ClientCmd, CommandCmd, ConfigCmd, Echo, Hello, Info, Ping};
pub use claim::{Claim, OnExpire};
pub use complete::Complete;
pub use forget::Forget;
pub use inspect::Inspect;
pub use journal::Journal;
pub use release::Release;
pub use renew::Renew;
pub use settle::Settle;

use bytes::Bytes;

use crate::error::CommandError;
use crate::frame::{Frame, parse_u64};

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
}

impl Command {
    /// Parses a request frame (an array of bulk strings).
    pub fn from_frame(frame: Frame) -> Result<Command, CommandError> {
        let Frame::Array(items) = frame else {
            return Err(CommandError::NotAnArray);
        };
        if !items
            .iter()
            .all(|f| matches!(f, Frame::Bulk(_) | Frame::Simple(_)))
        {
            return Err(CommandError::NotAnArray);
        }
        Command::from_items(items)
    }

    /// Parses a request from its arguments, the command name first.
    pub fn from_args(args: Vec<Bytes>) -> Result<Command, CommandError> {
        Command::from_items(args.into_iter().map(Frame::Bulk).collect())
    }

    /// Parses a request from frames already known to be strings.
    fn from_items(items: Vec<Frame>) -> Result<Command, CommandError> {
        let mut it = items.into_iter();
        let name = string(it.next()).ok_or(CommandError::Empty)?;
        macro_rules! parse {
            ($variant:ident, $ty:ty, $wire:literal) => {
                Command::$variant(<$ty>::parse(&mut Args::new($wire, it))?)
            };
        }
        let cmd = match name.len() {
            4 if name.eq_ignore_ascii_case(b"PING") => parse!(Ping, Ping, "ping"),
            4 if name.eq_ignore_ascii_case(b"ECHO") => parse!(Echo, Echo, "echo"),
            4 if name.eq_ignore_ascii_case(b"AUTH") => parse!(Auth, Auth, "auth"),
            4 if name.eq_ignore_ascii_case(b"QUIT") => {
                Args::new("quit", it).finish()?;
                Command::Quit
            }
            4 if name.eq_ignore_ascii_case(b"INFO") => parse!(Info, Info, "info"),
            5 if name.eq_ignore_ascii_case(b"CLAIM") => parse!(Claim, Claim, "claim"),
            5 if name.eq_ignore_ascii_case(b"HELLO") => parse!(Hello, Hello, "hello"),
            6 if name.eq_ignore_ascii_case(b"SETTLE") => parse!(Settle, Settle, "settle"),
            6 if name.eq_ignore_ascii_case(b"FORGET") => parse!(Forget, Forget, "forget"),
            6 if name.eq_ignore_ascii_case(b"DBSIZE") => {
                Args::new("dbsize", it).finish()?;
                Command::DbSize
            }
            6 if name.eq_ignore_ascii_case(b"CLIENT") => parse!(Client, ClientCmd, "client"),
            6 if name.eq_ignore_ascii_case(b"CONFIG") => parse!(Config, ConfigCmd, "config"),
            5 if name.eq_ignore_ascii_case(b"RENEW") => parse!(Renew, Renew, "renew"),
            7 if name.eq_ignore_ascii_case(b"JOURNAL") => parse!(Journal, Journal, "journal"),
            7 if name.eq_ignore_ascii_case(b"RELEASE") => parse!(Release, Release, "release"),
            7 if name.eq_ignore_ascii_case(b"ABANDON") => parse!(Abandon, Abandon, "abandon"),
            7 if name.eq_ignore_ascii_case(b"INSPECT") => parse!(Inspect, Inspect, "inspect"),
            7 if name.eq_ignore_ascii_case(b"COMMAND") => parse!(Command, CommandCmd, "command"),
            8 if name.eq_ignore_ascii_case(b"COMPLETE") => parse!(Complete, Complete, "complete"),
            _ => return Err(CommandError::Unknown(name)),
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
        }
        Frame::Array(out)
    }

    /// The command's name in lower case, as `CLIENT LIST` and metrics show it.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Claim(_) => "claim",
            Command::Settle(_) => "settle",
            Command::Complete(_) => "complete",
            Command::Renew(_) => "renew",
            Command::Journal(_) => "journal",
            Command::Release(_) => "release",
            Command::Abandon(_) => "abandon",
            Command::Inspect(_) => "inspect",
            Command::Forget(_) => "forget",
            Command::Ping(_) => "ping",
            Command::Echo(_) => "echo",
            Command::Hello(_) => "hello",
            Command::Auth(_) => "auth",
            Command::Quit => "quit",
            Command::Info(_) => "info",
            Command::DbSize => "dbsize",
            Command::Client(_) => "client",
            Command::Command(_) => "command",
            Command::Config(_) => "config",
        }
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

/// Every command name the server knows, with its arity in the `COMMAND`
/// reply convention (negative: at least that many arguments).
pub const COMMAND_TABLE: &[(&str, i64)] = &[
    ("claim", -2),
    ("settle", -2),
    ("complete", -4),
    ("renew", 5),
    ("journal", 4),
    ("release", 3),
    ("abandon", 3),
    ("inspect", 2),
    ("forget", 2),
    ("ping", -1),
    ("echo", 2),
    ("hello", -1),
    ("auth", -2),
    ("quit", 1),
    ("info", -1),
    ("dbsize", 1),
    ("client", -2),
    ("command", -1),
    ("config", -2),
];

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
