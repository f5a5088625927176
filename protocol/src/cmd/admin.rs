//! Connection and server commands, enough for redis-cli and
//! redis-benchmark: `PING`, `ECHO`, `HELLO`, `AUTH`, `INFO`, `CLIENT`,
//! `COMMAND`, `CONFIG GET`.

use bytes::Bytes;

use super::{Args, num, word};
use crate::error::CommandError;
use crate::frame::Frame;

/// `PING [message]`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ping {
    /// Echoed back as a bulk string when present; otherwise `+PONG`.
    pub message: Option<Bytes>,
}

impl Ping {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let p = Ping {
            message: args.next(),
        };
        args.finish_ref()?;
        Ok(p)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("PING"));
        if let Some(m) = &self.message {
            out.push(Frame::Bulk(m.clone()));
        }
    }
}

/// `ECHO message`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Echo {
    /// The message to return.
    pub message: Bytes,
}

impl Echo {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let e = Echo {
            message: args.required()?,
        };
        args.finish_ref()?;
        Ok(e)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.extend([word("ECHO"), Frame::Bulk(self.message.clone())]);
    }
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hello {
    /// Protocol version asked for (2 or 3); `None` keeps the current one.
    pub version: Option<u64>,
    /// Credentials, `(username, password)`.
    pub auth: Option<(Bytes, Bytes)>,
    /// A connection name to set.
    pub setname: Option<Bytes>,
}

impl Hello {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let mut h = Hello::default();
        let Some(v) = args.next() else {
            return Ok(h);
        };
        h.version = Some(
            crate::frame::parse_u64(&v).ok_or(CommandError::NotAnInteger("protocol version"))?,
        );
        while let Some(opt) = args.next() {
            if opt.eq_ignore_ascii_case(b"AUTH") {
                let user = args.option_value("AUTH", h.auth.is_some())?;
                let pass = args.required()?;
                h.auth = Some((user, pass));
            } else if opt.eq_ignore_ascii_case(b"SETNAME") {
                let name = args.option_value("SETNAME", h.setname.is_some())?;
                check_client_name(&name)?;
                h.setname = Some(name);
            } else {
                return Err(CommandError::UnknownOption {
                    command: args.cmd(),
                    option: opt,
                });
            }
        }
        Ok(h)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("HELLO"));
        if let Some(v) = self.version {
            out.push(num(v));
            if let Some((u, p)) = &self.auth {
                out.extend([word("AUTH"), Frame::Bulk(u.clone()), Frame::Bulk(p.clone())]);
            }
            if let Some(n) = &self.setname {
                out.extend([word("SETNAME"), Frame::Bulk(n.clone())]);
            }
        }
    }
}

/// `AUTH [username] password`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Auth {
    /// The user; `None` means the default user.
    pub username: Option<Bytes>,
    /// The password.
    pub password: Bytes,
}

impl Auth {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let first = args.required()?;
        let a = match args.next() {
            Some(password) => Auth {
                username: Some(first),
                password,
            },
            None => Auth {
                username: None,
                password: first,
            },
        };
        args.finish_ref()?;
        Ok(a)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("AUTH"));
        if let Some(u) = &self.username {
            out.push(Frame::Bulk(u.clone()));
        }
        out.push(Frame::Bulk(self.password.clone()));
    }
}

/// `INFO [section ...]`
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Info {
    /// Sections asked for; empty means the default set.
    pub sections: Vec<Bytes>,
}

impl Info {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        Ok(Info {
            sections: args.rest(),
        })
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("INFO"));
        out.extend(self.sections.iter().cloned().map(Frame::Bulk));
    }
}

/// `CLIENT` subcommands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientCmd {
    /// `CLIENT ID`
    Id,
    /// `CLIENT SETNAME name`
    SetName(Bytes),
    /// `CLIENT GETNAME`
    GetName,
    /// `CLIENT LIST`
    List,
    /// `CLIENT INFO`
    Info,
    /// `CLIENT SETINFO LIB-NAME|LIB-VER value`: what a client library says
    /// about itself (shown in `CLIENT LIST`).
    SetInfo {
        /// `lib-name` or `lib-ver`, lower case.
        attr: &'static str,
        /// The value (printable, no spaces).
        value: Bytes,
    },
    /// `CLIENT KILL ip:port` (the old form: `+OK` or an error) or
    /// `CLIENT KILL [ID id] [ADDR ip:port] [LADDR ip:port] [USER name]
    /// [SKIPME yes|no]` (the connections matching every filter given,
    /// counted).
    Kill(ClientKill),
}

/// Which connections `CLIENT KILL` closes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientKill {
    /// The connection id.
    pub id: Option<u64>,
    /// The client's address, `ip:port`.
    pub addr: Option<Bytes>,
    /// The local address it connected to, `ip:port`.
    pub laddr: Option<Bytes>,
    /// The user it acts as.
    pub user: Option<Bytes>,
    /// Whether the connection sending the command is left alone (the
    /// default).
    pub skip_me: bool,
    /// The old form, `CLIENT KILL ip:port`.
    pub old_form: bool,
}

impl ClientKill {
    fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let mut k = ClientKill {
            skip_me: true,
            ..ClientKill::default()
        };
        let first = args.required()?;
        let Some(value) = args.next() else {
            // The old form names one client, which may be the caller.
            k.addr = Some(first);
            k.old_form = true;
            k.skip_me = false;
            return Ok(k);
        };
        let mut pair = Some((first, value));
        while let Some((filter, value)) = pair.take() {
            let is = |w: &str| filter.eq_ignore_ascii_case(w.as_bytes());
            if is("ID") {
                k.id =
                    Some(crate::frame::parse_u64(&value).ok_or(CommandError::NotAnInteger("ID"))?);
            } else if is("ADDR") {
                k.addr = Some(value);
            } else if is("LADDR") {
                k.laddr = Some(value);
            } else if is("USER") {
                k.user = Some(value);
            } else if is("SKIPME") {
                k.skip_me = if value.eq_ignore_ascii_case(b"yes") {
                    true
                } else if value.eq_ignore_ascii_case(b"no") {
                    false
                } else {
                    return Err(CommandError::BadValue {
                        what: "SKIPME",
                        expected: "yes or no",
                    });
                };
            } else {
                return Err(CommandError::Syntax(
                    "CLIENT KILL filters are ID, ADDR, LADDR, USER and SKIPME, each with a value",
                ));
            }
            if let Some(f) = args.next() {
                let v = args.next().ok_or(CommandError::Syntax(
                    "CLIENT KILL filters are ID, ADDR, LADDR, USER and SKIPME, each with a value",
                ))?;
                pair = Some((f, v));
            }
        }
        Ok(k)
    }

    fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("KILL"));
        if self.old_form {
            out.extend(self.addr.iter().cloned().map(Frame::Bulk));
            return;
        }
        if let Some(id) = self.id {
            out.extend([word("ID"), num(id)]);
        }
        for (w, v) in [
            ("ADDR", &self.addr),
            ("LADDR", &self.laddr),
            ("USER", &self.user),
        ] {
            if let Some(v) = v {
                out.extend([word(w), Frame::Bulk(v.clone())]);
            }
        }
        // Always written: with no other filter it is the one that makes
        // this the new form.
        out.extend([
            word("SKIPME"),
            word(if self.skip_me { "yes" } else { "no" }),
        ]);
    }
}

/// A connection name shows in `CLIENT LIST` lines: printable ASCII
/// without spaces only (as Redis checks), whichever command sets it.
fn check_client_name(name: &[u8]) -> Result<(), CommandError> {
    if name.iter().any(|&b| b <= b' ' || b > b'~') {
        return Err(CommandError::Syntax(
            "client names cannot contain spaces, newlines or special characters",
        ));
    }
    Ok(())
}

impl ClientCmd {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let sub = args.required()?;
        let c = if sub.eq_ignore_ascii_case(b"ID") {
            ClientCmd::Id
        } else if sub.eq_ignore_ascii_case(b"SETNAME") {
            let name = args.required()?;
            check_client_name(&name)?;
            ClientCmd::SetName(name)
        } else if sub.eq_ignore_ascii_case(b"GETNAME") {
            ClientCmd::GetName
        } else if sub.eq_ignore_ascii_case(b"LIST") {
            ClientCmd::List
        } else if sub.eq_ignore_ascii_case(b"INFO") {
            ClientCmd::Info
        } else if sub.eq_ignore_ascii_case(b"SETINFO") {
            let attr = args.required()?;
            let attr = if attr.eq_ignore_ascii_case(b"LIB-NAME") {
                "lib-name"
            } else if attr.eq_ignore_ascii_case(b"LIB-VER") {
                "lib-ver"
            } else {
                return Err(CommandError::Syntax(
                    "unrecognized option for CLIENT SETINFO: use LIB-NAME or LIB-VER",
                ));
            };
            let value = args.required()?;
            check_client_name(&value)?;
            ClientCmd::SetInfo { attr, value }
        } else if sub.eq_ignore_ascii_case(b"KILL") {
            ClientCmd::Kill(ClientKill::parse(args)?)
        } else {
            return Err(CommandError::UnknownSubcommand {
                command: "client",
                sub,
            });
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("CLIENT"));
        match self {
            ClientCmd::Id => out.push(word("ID")),
            ClientCmd::SetName(n) => out.extend([word("SETNAME"), Frame::Bulk(n.clone())]),
            ClientCmd::GetName => out.push(word("GETNAME")),
            ClientCmd::List => out.push(word("LIST")),
            ClientCmd::Info => out.push(word("INFO")),
            ClientCmd::SetInfo { attr, value } => out.extend([
                word("SETINFO"),
                Frame::Bulk(Bytes::from_static(attr.as_bytes())),
                Frame::Bulk(value.clone()),
            ]),
            ClientCmd::Kill(k) => k.write_args(out),
        }
    }
}

/// `COMMAND` and its subcommands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandCmd {
    /// `COMMAND` — every command's description.
    All,
    /// `COMMAND COUNT`
    Count,
    /// `COMMAND DOCS [name ...]`
    Docs(Vec<Bytes>),
    /// `COMMAND INFO [name ...]`
    Info(Vec<Bytes>),
}

impl CommandCmd {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let Some(sub) = args.next() else {
            return Ok(CommandCmd::All);
        };
        if sub.eq_ignore_ascii_case(b"COUNT") {
            args.finish_ref()?;
            Ok(CommandCmd::Count)
        } else if sub.eq_ignore_ascii_case(b"DOCS") {
            Ok(CommandCmd::Docs(args.rest()))
        } else if sub.eq_ignore_ascii_case(b"INFO") {
            Ok(CommandCmd::Info(args.rest()))
        } else {
            Err(CommandError::UnknownSubcommand {
                command: "command",
                sub,
            })
        }
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("COMMAND"));
        match self {
            CommandCmd::All => {}
            CommandCmd::Count => out.push(word("COUNT")),
            CommandCmd::Docs(n) => {
                out.push(word("DOCS"));
                out.extend(n.iter().cloned().map(Frame::Bulk));
            }
            CommandCmd::Info(n) => {
                out.push(word("INFO"));
                out.extend(n.iter().cloned().map(Frame::Bulk));
            }
        }
    }
}

/// `CONFIG GET pattern [pattern ...]`, `CONFIG RELOAD-TLS` and
/// `CONFIG RESETSTAT` (the server's configuration is otherwise read-only
/// at run time).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigCmd {
    /// `CONFIG GET` with glob patterns.
    Get(Vec<Bytes>),
    /// `CONFIG RELOAD-TLS`: read the TLS certificate, key and CA files
    /// again.
    ReloadTls,
    /// `CONFIG RESETSTAT`: set the per-command and per-error statistics
    /// (`INFO commandstats`, `errorstats`, `latencystats`) back to zero.
    ResetStat,
}

impl ConfigCmd {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let sub = args.required()?;
        if sub.eq_ignore_ascii_case(b"GET") {
            let patterns = args.rest();
            if patterns.is_empty() {
                return Err(CommandError::WrongArity("config|get"));
            }
            Ok(ConfigCmd::Get(patterns))
        } else if sub.eq_ignore_ascii_case(b"RELOAD-TLS") {
            args.finish_ref()?;
            Ok(ConfigCmd::ReloadTls)
        } else if sub.eq_ignore_ascii_case(b"RESETSTAT") {
            args.finish_ref()?;
            Ok(ConfigCmd::ResetStat)
        } else {
            Err(CommandError::UnknownSubcommand {
                command: "config",
                sub,
            })
        }
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("CONFIG"));
        match self {
            ConfigCmd::Get(p) => {
                out.push(word("GET"));
                out.extend(p.iter().cloned().map(Frame::Bulk));
            }
            ConfigCmd::ReloadTls => out.push(word("RELOAD-TLS")),
            ConfigCmd::ResetStat => out.push(word("RESETSTAT")),
        }
    }
}

/// `LATENCY` subcommands. Idem has no latency monitor (Redis's is off by
/// default too): `LATEST`, `HISTORY`, `RESET` and `DOCTOR` answer as Redis
/// does with it off; `HISTOGRAM` gives the per-command latencies INFO latencystats
/// is drawn from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LatencyCmd {
    /// `LATENCY LATEST`: the latest spike of each event (none).
    Latest,
    /// `LATENCY HISTORY event`: an event's spikes (none).
    History(Bytes),
    /// `LATENCY RESET [event ...]`: forget events' spikes (0 reset).
    Reset(Vec<Bytes>),
    /// `LATENCY HISTOGRAM [command ...]`: commands' latency histograms
    /// (every command called, when none is named).
    Histogram(Vec<Bytes>),
    /// `LATENCY DOCTOR`: a report for people.
    Doctor,
    /// `LATENCY HELP`.
    Help,
}

impl LatencyCmd {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let sub = args.required()?;
        let is = |w: &str| sub.eq_ignore_ascii_case(w.as_bytes());
        let c = if is("LATEST") {
            LatencyCmd::Latest
        } else if is("HISTORY") {
            let event = args
                .next()
                .ok_or(CommandError::WrongArity("latency|history"))?;
            LatencyCmd::History(event)
        } else if is("RESET") {
            LatencyCmd::Reset(args.rest())
        } else if is("HISTOGRAM") {
            LatencyCmd::Histogram(args.rest())
        } else if is("DOCTOR") {
            LatencyCmd::Doctor
        } else if is("HELP") {
            LatencyCmd::Help
        } else {
            return Err(CommandError::UnknownSubcommand {
                command: "latency",
                sub,
            });
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("LATENCY"));
        match self {
            LatencyCmd::Latest => out.push(word("LATEST")),
            LatencyCmd::History(e) => out.extend([word("HISTORY"), Frame::Bulk(e.clone())]),
            LatencyCmd::Reset(e) => {
                out.push(word("RESET"));
                out.extend(e.iter().cloned().map(Frame::Bulk));
            }
            LatencyCmd::Histogram(c) => {
                out.push(word("HISTOGRAM"));
                out.extend(c.iter().cloned().map(Frame::Bulk));
            }
            LatencyCmd::Doctor => out.push(word("DOCTOR")),
            LatencyCmd::Help => out.push(word("HELP")),
        }
    }
}

/// `ACL` subcommands (users are defined in the configuration or the ACL
/// file; there is no `ACL SETUSER`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AclCmd {
    /// `ACL WHOAMI`: the connection's user.
    WhoAmI,
    /// `ACL LIST`: every user as a rule line (passwords as hashes).
    List,
    /// `ACL USERS`: the user names.
    Users,
    /// `ACL CAT [category]`: the categories, or the commands of one.
    Cat(Option<Bytes>),
    /// `ACL LOAD`: reread the ACL file.
    Load,
    /// `ACL LOG [count]`: the latest denials, newest first (10 by default).
    Log(Option<u64>),
    /// `ACL LOG RESET`: forget the denials logged.
    LogReset,
}

impl AclCmd {
    pub(crate) fn parse(args: &mut Args) -> Result<Self, CommandError> {
        let sub = args.required()?;
        let is = |w: &str| sub.eq_ignore_ascii_case(w.as_bytes());
        let c = if is("WHOAMI") {
            AclCmd::WhoAmI
        } else if is("LIST") {
            AclCmd::List
        } else if is("USERS") {
            AclCmd::Users
        } else if is("CAT") {
            AclCmd::Cat(args.next())
        } else if is("LOAD") {
            AclCmd::Load
        } else if is("LOG") {
            match args.next() {
                None => AclCmd::Log(None),
                Some(a) if a.eq_ignore_ascii_case(b"RESET") => AclCmd::LogReset,
                Some(a) => AclCmd::Log(Some(
                    crate::frame::parse_u64(&a).ok_or(CommandError::NotAnInteger("count"))?,
                )),
            }
        } else {
            return Err(CommandError::UnknownSubcommand {
                command: "acl",
                sub,
            });
        };
        args.finish_ref()?;
        Ok(c)
    }

    pub(crate) fn write_args(&self, out: &mut Vec<Frame>) {
        out.push(word("ACL"));
        match self {
            AclCmd::WhoAmI => out.push(word("WHOAMI")),
            AclCmd::List => out.push(word("LIST")),
            AclCmd::Users => out.push(word("USERS")),
            AclCmd::Cat(c) => {
                out.push(word("CAT"));
                out.extend(c.iter().cloned().map(Frame::Bulk));
            }
            AclCmd::Load => out.push(word("LOAD")),
            AclCmd::Log(n) => {
                out.push(word("LOG"));
                out.extend(n.map(num));
            }
            AclCmd::LogReset => out.extend([word("LOG"), word("RESET")]),
        }
    }
}
