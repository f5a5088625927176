//! Dispatch: the one place a typed command meets the server. Record
//! commands are checked against the request limits; writes go to the
//! engine as ops, reads to the local store, waits to the waiters;
//! connection and server commands go to `admin`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use idem_protocol::cmd::Scan;
use idem_protocol::{Command, ErrorCode, Flags, Frame, Reply, ServerError};

use crate::acl::{Denial, Denied, Glob, User};
use crate::admin;
use crate::config::RequestLimits;
use crate::engine::{Submission, Submitted};
use crate::metrics::bump;
use crate::node::Node;
use crate::session::Session;
use crate::store::{Op, Read};
use crate::waiters::Waiters;

/// A reply that comes later.
pub type Later = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// What the connection does with a command's result.
pub enum Action {
    /// Send this reply.
    Reply(Reply),
    /// The reply comes later; later commands may run meanwhile.
    Pending(Later),
    /// The request may wait (WAIT, or a command held while the leader's
    /// lease has lapsed): later commands on the connection run only after
    /// it is answered, as with Redis blocking commands.
    Block(Later),
    /// A read whose reply comes later (a follower's linearizable read):
    /// later commands may run meanwhile, and later reads are not held
    /// behind it as they are behind a write.
    Read(Later),
    /// Send this reply, then close.
    Close(Reply),
}

/// `CLIENT LIST`: every client's line, formatted off the runtime's
/// threads (thousands of clients take a while: done inline, a few callers
/// stalled every connection and the Raft core for seconds), one list at a
/// time server-wide, so its callers wait for each other and not the rest.
fn client_list(node: &Node) -> Action {
    static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let node = node.clone();
    Action::Pending(Box::pin(async move {
        let Ok(_turn) = ONE_AT_A_TIME.acquire().await else {
            return err("CLIENT LIST is not available");
        };
        match tokio::task::spawn_blocking(move || node.clients().list()).await {
            Ok(list) => Reply::Frame(Frame::Bulk(Bytes::from(list))),
            Err(_) => err("CLIENT LIST failed"),
        }
    }))
}

/// How long one `SCAN` call may walk the records: past it, the call
/// answers with what it found and the cursor to go on from.
const SCAN_TIME: std::time::Duration = std::time::Duration::from_millis(10);

/// `SCAN`: a step of a walk over this node's own records (a follower's
/// copy may lag the leader's by what it has not applied yet), listing the
/// keys the user may read; at most `max_scan_count` records and
/// [`SCAN_TIME`] a step, off the runtime's threads, one step at a time
/// server-wide (a MATCH pattern is client input: matching costs up to the
/// product of its length and the key's).
fn scan(node: &Node, session: &Session, s: Scan) -> Action {
    static ONE_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let limits = &node.config().limits;
    if s.pattern
        .as_ref()
        .is_some_and(|p| p.len() > limits.max_key_bytes)
    {
        return Action::Reply(Reply::Error(toobig("MATCH pattern is over max_key_bytes")));
    }
    let count = s
        .count
        .map_or(10, |n| usize::try_from(n).unwrap_or(usize::MAX))
        .min(node.config().max_scan_count);
    let (node, user) = (node.clone(), session.user.clone());
    Action::Pending(Box::pin(async move {
        let Ok(turn) = ONE_AT_A_TIME.acquire().await else {
            return err("SCAN is not available");
        };
        // The turn goes with the walk: a client that leaves mid-call does
        // not free it for another walk while this one still runs.
        let walk = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let glob = s.pattern.as_deref().map(Glob::new);
            let matches = |key: &[u8]| glob.as_ref().is_none_or(|g| g.matches(key));
            // A user confined to some keys: the others neither count nor
            // meet the client's pattern (whose cost would time them).
            let confined = user.as_ref().filter(|u| !u.reads_every_key());
            let may_read = |key: &[u8]| confined.is_none_or(|u| u.may_read(key));
            let visible: Option<crate::store::KeyTest<'_>> = confined.map(|_| &may_read as _);
            let until = std::time::Instant::now() + SCAN_TIME;
            node.engine()
                .scan(s.cursor, count, until, visible, &matches)
        });
        match walk.await {
            Ok((next, keys)) => Reply::Frame(Frame::Array(vec![
                Frame::bulk(next.to_string()),
                Frame::Array(keys.into_iter().map(Frame::Bulk).collect()),
            ])),
            Err(_) => err("SCAN failed"),
        }
    }))
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

fn reply_of(result: Submitted) -> Reply {
    match result {
        Ok(applied) => applied.reply,
        Err(e) => Reply::Error(e.to_server_error()),
    }
}

/// A `-MOVED` names the address this client's kind connects to (plain or
/// TLS, see `cluster::client_addr_for`).
fn for_client(reply: Reply, tls: bool) -> Reply {
    match reply {
        Reply::Error(e) if e.code == ErrorCode::Moved && e.message.contains('+') => {
            let (slot, addr) = e.message.split_once(' ').unwrap_or(("0", &e.message));
            let addr = crate::engine::raft::cluster::client_addr_for(addr, tls);
            Reply::Error(ServerError::owned(
                ErrorCode::Moved,
                format!("{slot} {addr}"),
            ))
        }
        other => other,
    }
}

/// Every redirect of `action`, whenever it is answered (a parked wait,
/// a write, a membership change), names the address of the client's kind.
fn redirects_for(action: Action, tls: bool) -> Action {
    match action {
        Action::Reply(r) => Action::Reply(for_client(r, tls)),
        Action::Close(r) => Action::Close(for_client(r, tls)),
        Action::Pending(f) => Action::Pending(Box::pin(async move { for_client(f.await, tls) })),
        Action::Block(f) => Action::Block(Box::pin(async move { for_client(f.await, tls) })),
        Action::Read(f) => Action::Read(Box::pin(async move { for_client(f.await, tls) })),
    }
}

/// Runs one command.
pub fn dispatch(node: &Node, session: &mut Session, cmd: Command) -> Action {
    let action = run(node, session, cmd);
    // Nodes with a TLS listener advertise `PLAIN+TLS`: redirects are cut
    // to the client's kind (other nodes pay nothing for it).
    if node.config().advertises_tls {
        redirects_for(action, session.tls)
    } else {
        action
    }
}

fn run(node: &Node, session: &mut Session, cmd: Command) -> Action {
    bump(&node.metrics().commands);
    session.info.ran(cmd.name());
    if let Err(closed) = refresh_user(node, session) {
        return closed;
    }
    match &session.user {
        None if !matches!(cmd, Command::Auth(_) | Command::Hello(_) | Command::Quit) => {
            return Action::Reply(Reply::Error(ServerError::new(
                ErrorCode::NoAuth,
                admin::NOAUTH,
            )));
        }
        Some(user) => match user.check(&cmd) {
            Ok(()) => {}
            // INFO is @admin, but cluster clients (redis-py's RedisCluster)
            // read `cluster_enabled` from it before anything else: without
            // the right to INFO, a user gets that section alone.
            Err(Denied::Command("info")) => {
                return Action::Reply(admin::info(
                    node,
                    &[Bytes::from_static(b"cluster")],
                    session.tls,
                ));
            }
            Err(denied) => {
                return Action::Reply(Reply::Error(refuse(node, session, user, denied, &cmd)));
            }
        },
        None => {}
    }
    if cmd.key().is_some() {
        return record(node, session, cmd);
    }
    if let Command::Cluster(c) = cmd {
        return crate::cluster_admin::cluster(node, c, session.tls);
    }
    if matches!(cmd, Command::Auth(_) | Command::Hello(_)) {
        return authenticate(node, session, cmd);
    }
    Action::Reply(match cmd {
        Command::Ping(p) => match p.message {
            None => Reply::Frame(Frame::simple("PONG")),
            Some(m) => Reply::Frame(Frame::Bulk(m)),
        },
        Command::Echo(e) => Reply::Frame(Frame::Bulk(e.message)),
        Command::Quit => return Action::Close(Reply::Ok),
        Command::Info(i) => admin::info(node, &i.sections, session.tls),
        Command::Role => crate::cluster_admin::role(node, session.tls),
        Command::DbSize => Reply::Frame(Frame::Integer(node.engine().len() as i64)),
        Command::Client(idem_protocol::cmd::ClientCmd::List) => return client_list(node),
        Command::Client(c) => admin::client(node, session, c),
        Command::Command(c) => admin::command(c),
        Command::Config(c) => admin::config(node, c),
        Command::Acl(c) => admin::acl(node, session, c),
        Command::Latency(c) => admin::latency(node, c),
        Command::Scan(s) => return scan(node, session, s),
        Command::Select(0) => Reply::Ok,
        Command::Select(_) => err("DB index is out of range"),
        // Redis Cluster clients set to read from replicas (redis-py's
        // `read_from_replicas`, ioredis's `scaleReads`, Lettuce's
        // `ReadFrom`, go-redis's `ReadOnly`) send READONLY on every
        // connection and give the node up if it is refused. Every node
        // accepts both. After READONLY a follower answers the connection's
        // reads (SETTLE and INSPECT without WAIT) itself, once it has
        // applied what the leader had committed when asked (linearizable,
        // as the leader's own); it redirects everything else to the
        // leader. A follower that redirected those reads too sent these
        // clients back to the replica they took the leader's MOVED for,
        // round after round.
        Command::ReadOnly => {
            session.readonly = true;
            Reply::Ok
        }
        Command::ReadWrite => {
            session.readonly = false;
            Reply::Ok
        }
        _ => err("unsupported command"),
    })
}

/// Looks the connection's user up again after `ACL LOAD`: its new rules
/// apply from this command on; a user removed or turned off, or one of
/// whose passwords was revoked, closes the connection.
fn refresh_user(node: &Node, session: &mut Session) -> Result<(), Action> {
    let epoch = node.acl_epoch();
    if epoch == session.acl_epoch {
        return Ok(());
    }
    session.acl_epoch = epoch;
    let Some(user) = &session.user else {
        return Ok(());
    };
    match node.acl().user(user.name()) {
        Some(now) if now.enabled() && now.keeps_credentials_of(user) => {
            session.user = Some(Arc::clone(now));
            Ok(())
        }
        _ => Err(Action::Close(Reply::Error(ServerError::new(
            ErrorCode::NoAuth,
            "the user of this connection was removed or turned off, or a password of it was revoked (ACL LOAD): connect and authenticate again",
        )))),
    }
}

/// The `-NOPERM` for a refused command, logged for `ACL LOG`.
fn refuse(
    node: &Node,
    session: &Session,
    user: &User,
    denied: Denied,
    cmd: &Command,
) -> ServerError {
    let (reason, object, message) = match denied {
        Denied::Command(name) => {
            bump(&node.metrics().acl_denied_cmd);
            (
                "command",
                name.to_owned(),
                format!(
                    "User {} has no permissions to run the '{name}' command",
                    user.name()
                ),
            )
        }
        Denied::Wait(name) => {
            bump(&node.metrics().acl_denied_cmd);
            (
                "command",
                format!("{name} WAIT"),
                format!(
                    "User {} has no permissions to run the '{name}' command with WAIT above 0 (waiting needs +@blocking)",
                    user.name()
                ),
            )
        }
        Denied::Key => {
            bump(&node.metrics().acl_denied_key);
            (
                "key",
                String::from_utf8_lossy(cmd.key().map_or(&[][..], |k| &k[..])).into_owned(),
                format!(
                    "User {} has no permissions to access one of the keys used as arguments",
                    user.name()
                ),
            )
        }
    };
    node.log_denial(Denial {
        reason,
        object,
        username: user.name().to_owned(),
        client_info: session.info.line(),
    });
    ServerError::owned(ErrorCode::NoPerm, message)
}

/// How long a failed `AUTH` takes to answer: guessing is slow, and later
/// commands of the connection wait behind it; other clients do not.
const AUTH_FAILURE_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// `AUTH`, and `HELLO` (which may carry `AUTH`): from a source that gave
/// `max_auth_failures_per_sec` wrong passwords this second (or gave one
/// while all sources together gave that many), a password is not checked
/// but answered `-TRYAGAIN` once the second is over ([`AuthWindow`]).
///
/// [`AuthWindow`]: crate::metrics::AuthWindow
fn authenticate(node: &Node, session: &mut Session, cmd: Command) -> Action {
    let checks_password = match &cmd {
        Command::Auth(_) => true,
        Command::Hello(h) => h.auth.is_some(),
        _ => false,
    };
    let source = session.info.addr.ip().to_canonical();
    if checks_password && let Some(wait) = auth_throttled(node, source) {
        return Action::Block(Box::pin(async move {
            tokio::time::sleep(wait).await;
            Reply::Error(ServerError::new(
                ErrorCode::TryAgain,
                "too many wrong passwords from this address lately (max_auth_failures_per_sec): AUTH again",
            ))
        }));
    }
    let reply = match cmd {
        Command::Auth(a) => {
            let epoch = node.acl_epoch();
            match admin::check_password(node, session, a.username.as_deref(), &a.password) {
                Ok(user) => {
                    session.log_in(user, epoch);
                    Reply::Ok
                }
                Err(e) => Reply::Error(e),
            }
        }
        Command::Hello(h) => admin::hello(node, session, h),
        _ => err("not an authentication command"),
    };
    auth_answer(node, reply, source)
}

/// How long an `AUTH` must wait before it is checked: until the next
/// second once `max_auth_failures_per_sec` wrong passwords were given in
/// this one (`None`: checked now).
fn auth_throttled(node: &Node, source: std::net::IpAddr) -> Option<std::time::Duration> {
    let elapsed = node.started().elapsed();
    let throttled = node.metrics().auth_window.lock().throttled(
        elapsed.as_secs(),
        source,
        node.config().max_auth_failures_per_sec,
    );
    throttled.then(|| std::time::Duration::from_secs(elapsed.as_secs() + 1).saturating_sub(elapsed))
}

/// The answer to `AUTH` or `HELLO`: a refused password is answered only
/// after [`AUTH_FAILURE_DELAY`] (counted in INFO `auth_failures`).
fn auth_answer(node: &Node, reply: Reply, source: std::net::IpAddr) -> Action {
    match reply {
        Reply::Error(e) if e.code == ErrorCode::WrongPass => {
            bump(&node.metrics().auth_failures);
            let now = node.started().elapsed().as_secs();
            node.metrics().auth_window.lock().failed(now, source);
            Action::Block(Box::pin(async move {
                tokio::time::sleep(AUTH_FAILURE_DELAY).await;
                Reply::Error(e)
            }))
        }
        other => Action::Reply(other),
    }
}

/// The reply an action comes to.
async fn reply_of_action(action: Action) -> Reply {
    match action {
        Action::Reply(r) | Action::Close(r) => r,
        Action::Pending(later) | Action::Block(later) | Action::Read(later) => later.await,
    }
}

/// The reply to `cmd` from the local store, if it is a read (callers ask
/// [`reads_locally`] first). `expire`: a deadline the read saw pass is
/// applied through the engine (a leader's reads).
fn local_read(node: &Node, session: &Session, cmd: &Command, expire: bool) -> Option<Reply> {
    let engine = node.engine();
    let seen = match cmd {
        Command::Settle(s) => engine.read(Read::Settle(&s.key)),
        Command::Inspect(i) => engine.read(Read::Inspect(&i.key)),
        _ => return None,
    };
    if expire
        && seen.due
        && let Some(key) = cmd.key()
    {
        // Apply the passed deadline through the engine, so waiters are
        // served and memory freed at the same point everywhere.
        engine.expire_soon(key);
    }
    let mut reply = seen.reply.unwrap_or_else(|| err("no reply"));
    // The fence and attempt id are an owner's: shown only to users who
    // may write the key.
    if let Reply::Inspect(Some(info)) = &mut reply
        && let (Some(user), Some(key)) = (&session.user, cmd.key())
        && !user.may_own(key)
    {
        info.fence = 0;
        info.attempt = None;
    }
    Some(reply)
}

/// Whether `cmd` is answered from the local store ([`local_read`]): the
/// command table says which commands only read (answered from the store,
/// never through the log); one that waits is not.
fn reads_locally(cmd: &Command) -> bool {
    cmd.spec().flags.contains(Flags::READ)
        && match cmd {
            Command::Settle(s) => s.wait_ms.unwrap_or(0) == 0,
            Command::Inspect(_) => true,
            _ => false,
        }
}

/// A record command: a wait, a read or a write.
fn record(node: &Node, session: &Session, cmd: Command) -> Action {
    record_routed(node, session, cmd, true)
}

/// [`record`]; `may_hold`: a leader whose lease lapsed may hold it until a
/// majority answers again.
fn record_routed(node: &Node, session: &Session, cmd: Command, may_hold: bool) -> Action {
    if let Err(e) = validate(&cmd, &node.config().limits) {
        if e.code == ErrorCode::TooBig {
            bump(&node.metrics().toobig);
        }
        return Action::Reply(Reply::Error(e));
    }
    // Only the serving leader answers record commands, reads included
    // (but a READONLY connection's reads: below);
    // elsewhere: -MOVED to the leader, -TRYAGAIN or -CLUSTERDOWN.
    if let Err(e) = node.engine().route(cmd.key().map(|k| &k[..])) {
        // A follower answers a READONLY connection's reads once it has
        // applied the leader's read index; if that fails, the read goes
        // to the leader as any other.
        if session.readonly
            && may_hold
            && matches!(e, crate::engine::EngineError::Moved { .. })
            && reads_locally(&cmd)
        {
            let (node, session) = (node.clone(), session.clone());
            let barrier = node.engine().follower_read_barrier();
            return Action::Read(Box::pin(async move {
                match barrier.await {
                    Ok(()) => local_read(&node, &session, &cmd, false)
                        .unwrap_or_else(|| Reply::Error(e.to_server_error())),
                    // Routed again: the leader may have changed meanwhile
                    // (up to election_timeout_ms), or be this node now.
                    Err(_) => reply_of_action(record_routed(&node, &session, cmd, false)).await,
                }
            }));
        }
        // A leader no majority answered within its lease (their disks or
        // the network to them slow for a moment, or it is cut off) holds
        // the command, and the ones after it on this connection, until one
        // does, for at most `election_timeout_ms` after the lease lapsed:
        // a hiccup costs latency, not an error. Then it is served, or
        // answered as routing says (nothing is proposed while it is held).
        if may_hold && let Some(until) = node.engine().lease_hold_until() {
            let (node, session) = (node.clone(), session.clone());
            return Action::Block(Box::pin(async move {
                node.engine().lease_regained(until).await;
                reply_of_action(record_routed(&node, &session, cmd, false)).await
            }));
        }
        return Action::Reply(Reply::Error(e.to_server_error()));
    }
    let wait = match &cmd {
        Command::Claim(c) => c.wait_ms.unwrap_or(0),
        Command::Settle(s) => s.wait_ms.unwrap_or(0),
        _ => 0,
    };
    if wait > 0 {
        let waiters: Arc<Waiters> = Arc::clone(node.waiters());
        return Action::Block(Box::pin(waiters.wait(cmd, wait)));
    }
    let engine = node.engine();
    if reads_locally(&cmd) {
        // A leader answers from what it applied: once that is what was
        // committed (followers, applying on their own, may have shown a
        // committed write to READONLY readers already).
        if let Some(wait) = engine.leader_read_wait() {
            let (node, session) = (node.clone(), session.clone());
            return Action::Block(Box::pin(async move {
                wait.await;
                local_read(&node, &session, &cmd, true).unwrap_or_else(|| err("no reply"))
            }));
        }
        if let Some(reply) = local_read(node, session, &cmd, true) {
            return Action::Reply(reply);
        }
    }
    let Some(op) = Op::from_command(cmd, &node.config().defaults) else {
        return Action::Reply(err("not a record command"));
    };
    // With a log, a CLAIM that changes nothing (a replay, a mismatch, a
    // live owner) is answered from the store, unless this connection's
    // earlier writes are still on their way (it must see them).
    if let Op::Claim(c) = &op
        && engine.has_log()
        && !session.writes_pending
    {
        let seen = engine.read(Read::Claim(c));
        if let Some(reply) = seen.reply.filter(|_| !seen.due) {
            return Action::Reply(reply);
        }
    }
    // Routed above, and nothing awaited since.
    match engine.submit_routed(op) {
        Submission::Ready(Some(Ok(applied))) => Action::Reply(applied.reply),
        // Not proposed yet (the queue is full): nothing after it on this
        // connection may run before it, or it could be overtaken.
        waiting @ Submission::Waiting(_) => {
            Action::Block(Box::pin(async move { reply_of(waiting.await) }))
        }
        later => Action::Pending(Box::pin(async move { reply_of(later.await) })),
    }
}
