//! Dispatch: the one place a typed command meets the server. Record
//! commands are checked against the request limits and go to the engine
//! (and the waiters when they WAIT); connection and server commands are
//! answered here.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use idem_protocol::cmd::{ClientCmd, CommandCmd, ConfigCmd, Hello};
use idem_protocol::{Command, ErrorCode, Frame, Reply, ServerError, Version};

use crate::clients::ClientInfo;
use crate::config::RequestLimits;
use crate::server::Shared;
use crate::waiters::{Parked, WaitHandle};

/// What the connection does with a command's result.
pub enum Action {
    /// Send this reply.
    Reply(Reply),
    /// The request is parked: send its reply when the handle resolves.
    Park(WaitHandle),
    /// Send this reply, then close.
    Close(Reply),
}

/// Per-connection state commands can change.
pub struct Session {
    /// The registry entry of this connection.
    pub info: Arc<ClientInfo>,
    /// The protocol version (HELLO).
    pub version: Version,
}

fn err(message: &'static str) -> Reply {
    Reply::Error(ServerError::new(ErrorCode::Err, message))
}

fn toobig(message: &'static str) -> ServerError {
    ServerError::new(ErrorCode::TooBig, message)
}

/// Checks sizes and time bounds of a record command.
fn validate(cmd: &Command, l: &RequestLimits) -> Result<(), ServerError> {
    let key = cmd.key().map_or(0, Bytes::len);
    if key > l.max_key_bytes {
        return Err(toobig("key is over max_key_bytes"));
    }
    if key == 0 && cmd.key().is_some() {
        return Err(ServerError::new(ErrorCode::Err, "key must not be empty"));
    }
    let lease = |v: Option<u64>| match v {
        Some(ms) if ms == 0 || ms > l.max_lease_ms => Err(ServerError::owned(
            ErrorCode::Err,
            format!("LEASE must be between 1 and {} ms", l.max_lease_ms),
        )),
        _ => Ok(()),
    };
    let retain = |v: Option<u64>| match v {
        Some(ms) if ms == 0 || ms > l.max_retain_ms => Err(ServerError::owned(
            ErrorCode::Err,
            format!("RETAIN must be between 1 and {} ms", l.max_retain_ms),
        )),
        _ => Ok(()),
    };
    let wait = |v: Option<u64>| match v {
        Some(ms) if ms > l.max_wait_ms => Err(ServerError::owned(
            ErrorCode::Err,
            format!("WAIT must be between 0 and {} ms", l.max_wait_ms),
        )),
        _ => Ok(()),
    };
    match cmd {
        Command::Claim(c) => {
            lease(c.lease_ms)?;
            retain(c.retain_ms)?;
            wait(c.wait_ms)?;
            if c.fingerprint
                .as_ref()
                .is_some_and(|f| f.len() > l.max_fingerprint_bytes)
            {
                return Err(toobig("fingerprint is over max_fingerprint_bytes"));
            }
            if c.attempt
                .as_ref()
                .is_some_and(|a| a.len() > l.max_attempt_bytes)
            {
                return Err(toobig("attempt id is over max_attempt_bytes"));
            }
        }
        Command::Settle(s) => wait(s.wait_ms)?,
        Command::Complete(c) => {
            retain(c.retain_ms)?;
            if c.value.len() > l.max_value_bytes {
                return Err(toobig("value is over max_value_bytes"));
            }
        }
        Command::Renew(r) => lease(Some(r.lease_ms))?,
        Command::Journal(j) if j.journal.len() > l.max_journal_bytes => {
            return Err(toobig("journal is over max_journal_bytes"));
        }
        _ => {}
    }
    Ok(())
}

/// Runs one command.
pub fn dispatch(shared: &Arc<Shared>, session: &mut Session, cmd: Command) -> Action {
    shared.metrics.commands.fetch_add(1, Ordering::Relaxed);
    {
        let mut last = session.info.last.lock();
        *last = (cmd.name(), session.info.since.elapsed().as_millis() as u64);
    }
    if cmd.key().is_some() {
        if let Err(e) = validate(&cmd, &shared.config.limits) {
            if e.code == ErrorCode::TooBig {
                shared.metrics.toobig.fetch_add(1, Ordering::Relaxed);
            }
            return Action::Reply(Reply::Error(e));
        }
        let wait = match &cmd {
            Command::Claim(c) => c.wait_ms.unwrap_or(0),
            Command::Settle(s) => s.wait_ms.unwrap_or(0),
            _ => 0,
        };
        if wait > 0 {
            return match shared.waiters.apply_or_park(&cmd, wait) {
                Parked::Done(reply) => Action::Reply(reply),
                Parked::Waiting(handle) => Action::Park(handle),
            };
        }
        let applied = shared.engine.apply(&cmd);
        if let Some(key) = cmd.key().filter(|_| applied.wake) {
            shared.waiters.wake(key);
        }
        return Action::Reply(applied.reply);
    }
    Action::Reply(match cmd {
        Command::Ping(p) => match p.message {
            None => Reply::Frame(Frame::simple("PONG")),
            Some(m) => Reply::Frame(Frame::Bulk(m)),
        },
        Command::Echo(e) => Reply::Frame(Frame::Bulk(e.message)),
        Command::Hello(h) => hello(shared, session, h),
        Command::Auth(_) => {
            err("AUTH <password> called without any password configured for the default user")
        }
        Command::Quit => return Action::Close(Reply::Ok),
        Command::Info(i) => {
            let wanted: Vec<String> = i
                .sections
                .iter()
                .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
                .collect();
            Reply::Frame(Frame::Bulk(Bytes::from(crate::metrics::info(
                shared, &wanted,
            ))))
        }
        Command::DbSize => Reply::Frame(Frame::Integer(shared.engine.len() as i64)),
        Command::Client(c) => client(shared, session, c),
        Command::Command(c) => command(c),
        Command::Config(ConfigCmd::Get(patterns)) => {
            let mut pairs = Vec::new();
            for (k, v) in shared.config.raw.entries() {
                if patterns
                    .iter()
                    .any(|p| glob(&p.to_ascii_lowercase(), k.as_bytes()))
                {
                    pairs.push((
                        Frame::Bulk(Bytes::from_static(k.as_bytes())),
                        Frame::Bulk(Bytes::from(v)),
                    ));
                }
            }
            Reply::Frame(Frame::Map(pairs))
        }
        _ => err("unsupported command"),
    })
}

fn hello(shared: &Shared, session: &mut Session, h: Hello) -> Reply {
    if h.auth.is_some() {
        return err("AUTH <password> called without any password configured for the default user");
    }
    match h.version {
        None => {}
        Some(2) => session.version = Version::Resp2,
        Some(3) => session.version = Version::Resp3,
        Some(_) => {
            return Reply::Error(ServerError::new(
                ErrorCode::NoProto,
                "unsupported protocol version",
            ));
        }
    }
    let proto = if session.version == Version::Resp3 {
        3
    } else {
        2
    };
    session.info.resp.store(proto, Ordering::Relaxed);
    if let Some(name) = h.setname {
        *session.info.name.lock() = Some(name);
    }
    let s = |v: &'static str| Frame::Bulk(Bytes::from_static(v.as_bytes()));
    Reply::Frame(Frame::Map(vec![
        (s("server"), s("idem")),
        (s("version"), s(env!("CARGO_PKG_VERSION"))),
        (s("proto"), Frame::Integer(proto as i64)),
        (s("id"), Frame::Integer(session.info.id as i64)),
        (s("mode"), s("standalone")),
        (s("role"), s("master")),
        (
            s("engine"),
            Frame::Bulk(Bytes::from(
                format!("{:?}", shared.engine.kind()).to_lowercase(),
            )),
        ),
        (s("modules"), Frame::Array(vec![])),
    ]))
}

fn client(shared: &Shared, session: &mut Session, c: ClientCmd) -> Reply {
    match c {
        ClientCmd::Id => Reply::Frame(Frame::Integer(session.info.id as i64)),
        ClientCmd::SetName(name) => {
            *session.info.name.lock() = if name.is_empty() { None } else { Some(name) };
            Reply::Ok
        }
        ClientCmd::GetName => Reply::Frame(
            session
                .info
                .name
                .lock()
                .clone()
                .map_or(Frame::Null, Frame::Bulk),
        ),
        ClientCmd::List => Reply::Frame(Frame::Bulk(Bytes::from(shared.clients.list()))),
        ClientCmd::Info => Reply::Frame(Frame::Bulk(Bytes::from(session.info.line() + "\n"))),
        _ => err("unsupported CLIENT subcommand"),
    }
}

fn command_entry(name: &'static str, arity: i64) -> Frame {
    let keyed = !matches!(
        name,
        "ping"
            | "echo"
            | "hello"
            | "auth"
            | "quit"
            | "info"
            | "dbsize"
            | "client"
            | "command"
            | "config"
    );
    let write = matches!(
        name,
        "claim" | "complete" | "renew" | "journal" | "release" | "abandon" | "forget"
    );
    let mut flags = vec![Frame::simple(if write { "write" } else { "readonly" })];
    if matches!(name, "claim" | "settle") {
        flags.push(Frame::simple("blocking"));
    }
    let k = if keyed { 1 } else { 0 };
    Frame::Array(vec![
        Frame::Bulk(Bytes::from_static(name.as_bytes())),
        Frame::Integer(arity),
        Frame::Array(flags),
        Frame::Integer(k),
        Frame::Integer(k),
        Frame::Integer(k),
    ])
}

fn command(c: CommandCmd) -> Reply {
    use idem_protocol::cmd::COMMAND_TABLE;
    Reply::Frame(match c {
        CommandCmd::All => Frame::Array(
            COMMAND_TABLE
                .iter()
                .map(|&(n, a)| command_entry(n, a))
                .collect(),
        ),
        CommandCmd::Count => Frame::Integer(COMMAND_TABLE.len() as i64),
        // No documentation entries: redis-cli then simply shows no hints.
        CommandCmd::Docs(_) => Frame::Map(vec![]),
        CommandCmd::Info(names) => Frame::Array(
            names
                .iter()
                .map(|n| {
                    COMMAND_TABLE
                        .iter()
                        .find(|(name, _)| n.eq_ignore_ascii_case(name.as_bytes()))
                        .map_or(Frame::Null, |&(name, a)| command_entry(name, a))
                })
                .collect(),
        ),
        _ => Frame::Array(vec![]),
    })
}

/// Glob matching with `*` and `?` (as `CONFIG GET` patterns use).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            mark = t;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            mark += 1;
            t = mark;
        } else {
            return false;
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_like_redis() {
        assert!(glob(b"*", b"anything"));
        assert!(glob(b"max_*_ms", b"max_wait_ms"));
        assert!(glob(b"max_?ait_ms", b"max_wait_ms"));
        assert!(!glob(b"max_*", b"listen"));
        assert!(glob(b"listen", b"listen"));
        assert!(!glob(b"liste", b"listen"));
    }
}
