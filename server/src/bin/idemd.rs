//! `idemd`: run the Idem idempotency server.
//!
//! With no arguments it serves on 127.0.0.1:7379 with the durable raft
//! engine (data in `./idem-data`) and default limits. Configuration: `--config FILE` (TOML, see
//! `config/idem.toml`), then `IDEM_*` environment variables, then flags.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use clap::Parser;
use idem_server::config::RawConfig;
use idem_server::server::Server;
use tracing_subscriber::EnvFilter;

/// mimalloc: size classes that fit the store's small records closely and
/// no per-allocation header, so resident memory tracks live data.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the server looks whether it has gone quiet.
const QUIET_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Commands, and changes in the number of records, a look may see and
/// still count as quiet: a trickle (a health check every second, an odd
/// request) must not keep a burst's memory for good (it did: with a PING
/// every 0.5 s after a burst, 160 MB stayed held, the log unpurged, for as
/// long as the pings went on).
const QUIET_CHANGES: u64 = 100;

/// Growth of the raft log a look may see and still count as quiet (a
/// trickle's entries; a purge, a fall, is activity).
const QUIET_LOG_GROWTH: u64 = 256 << 10;

/// Whether the `quiet`-th quiet look in a row (1 = the first after
/// activity) gives memory back: the first also lets the engine trim and
/// the raft engine snapshot, so the log it holds is purged; the next ones
/// return what that freed (the allocator returns pages one thread freed
/// into another's only as their owner collects, and purges freed pages a
/// while after), and the later, sparser ones what is freed later still.
fn collects_at(quiet: u64) -> bool {
    quiet <= 15 || matches!(quiet, 30 | 60 | 120)
}

/// Bumped to ask every runtime thread to collect once more.
static COLLECT_EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last epoch this thread collected for.
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// Runs on each runtime thread as it parks (goes idle), and on the log
/// writer thread when it is idle: collects if asked since this thread last
/// did.
///
/// mimalloc keeps a heap per thread, and only the owning thread can give
/// its free pages back: a page freed into by another thread (a record
/// allocated while one worker served a request, dropped when another
/// applied an expiry) is returned only when its owner collects. mimalloc
/// would give them back on the owner's next use after a delay, so a server
/// that goes quiet after FORGET or expiry would keep them indefinitely.
/// The call to `mi_collect` is the one exception to the workspace's
/// `unsafe_code` ban.
///
/// Why it is sound: `mi_collect` takes no pointers and no state of ours;
/// it only walks mimalloc's own structures for the calling thread (and the
/// process-wide arenas, which are thread-safe), and it is mimalloc that
/// serves every allocation of this process (the global allocator above).
fn collect_if_asked() {
    let asked = COLLECT_EPOCH.load(Ordering::Relaxed);
    if COLLECTED.get() < asked {
        COLLECTED.set(asked);
        #[allow(unsafe_code)]
        // SAFETY: see above: no arguments but a flag, no Rust state.
        unsafe {
            libmimalloc_sys::mi_collect(true);
        }
    }
}

/// Gives memory back once the server goes quiet: at most a trickle of
/// commands and changes in the records stored (expiry) since the last
/// look ([`QUIET_CHANGES`], [`QUIET_LOG_GROWTH`]), after more than that.
/// The engine first trims (and the raft engine snapshots if the log it
/// holds is worth freeing); then every runtime thread is asked to collect
/// ([`collect_if_asked`]) and made to park again so it does
/// ([`park_every_worker`]).
async fn return_memory_when_quiet(node: idem_server::node::Node) {
    // A purge of the raft log after the quiet snapshot counts as activity
    // too: the collects that follow return what it freed.
    let activity = || {
        (
            node.metrics().commands.load(Ordering::Relaxed),
            node.engine().len(),
            node.engine().raft_info().map(|(r, _)| r.log_bytes),
        )
    };
    let mut seen = activity();
    // Quiet looks since the last activity (saturating: past the last
    // collect nothing more happens until the next activity).
    let mut quiet = u64::MAX;
    loop {
        tokio::time::sleep(QUIET_CHECK_EVERY).await;
        let now = activity();
        let (commands, records, log) = (
            now.0.saturating_sub(seen.0),
            now.1.abs_diff(seen.1) as u64,
            (seen.2, now.2),
        );
        seen = now;
        let log_quiet = match log {
            (Some(before), Some(after)) => after >= before && after - before <= QUIET_LOG_GROWTH,
            (before, after) => before == after,
        };
        if commands > QUIET_CHANGES || records > QUIET_CHANGES || !log_quiet {
            quiet = 0;
            continue;
        }
        quiet = quiet.saturating_add(1);
        if !collects_at(quiet) {
            continue;
        }
        if quiet == 1 {
            node.engine().when_quiet().await;
        }
        COLLECT_EPOCH.fetch_add(1, Ordering::Relaxed);
        park_every_worker().await;
    }
}

/// Makes every worker thread of the runtime park at least once, so each
/// collects (see [`collect_if_asked`]); best effort. A parked worker wakes
/// only when there is work it might steal, so a few tasks that hold their
/// worker for a millisecond are spawned until every worker's park count
/// has moved (at most 10 rounds of 20 ms; the server is quiet when this
/// runs, and with one worker a round holds it for about 2 ms). A park
/// count can also move without the hook running, which the later
/// collects of a quiet spell make up for.
async fn park_every_worker() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let workers = metrics.num_workers();
    let before: Vec<u64> = (0..workers).map(|w| metrics.worker_park_count(w)).collect();
    for _ in 0..10 {
        for _ in 0..workers * 2 {
            tokio::spawn(async {
                std::thread::sleep(std::time::Duration::from_millis(1));
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if (0..workers).all(|w| metrics.worker_park_count(w) > before[w]) {
            return;
        }
    }
}

/// The Idem idempotency server.
#[derive(Parser, Debug)]
#[command(name = "idemd", version, about)]
struct Args {
    /// Address to listen on, IP:PORT (default 127.0.0.1:7379; host names
    /// are not resolved here).
    #[arg(long, value_name = "IP:PORT")]
    listen: Option<String>,
    /// Storage engine: raft (default: a durable log on disk) or memory
    /// (nothing survives a restart).
    #[arg(long, value_name = "ENGINE")]
    engine: Option<String>,
    /// Data directory of the raft engine (default ./idem-data).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
    /// This node's id in its cluster (default 1; never reuse the id of a
    /// node whose data was lost).
    #[arg(long, value_name = "N")]
    node_id: Option<u64>,
    /// Address to listen on for peers (Raft traffic), IP:PORT; makes this
    /// node a cluster member. Not loopback: set `cluster_secret` too.
    #[arg(long, value_name = "IP:PORT")]
    peer_listen: Option<String>,
    /// The client address other nodes redirect to (default: --listen).
    #[arg(long, value_name = "IP:PORT")]
    advertise: Option<String>,
    /// The peer address other nodes connect to (default: --peer-listen).
    #[arg(long, value_name = "IP:PORT")]
    peer_advertise: Option<String>,
    /// Bootstrap a new cluster of these members: `1=HOST:PEERPORT,2=...`
    /// (host names are resolved when dialled; ignored once the data
    /// directory holds a membership).
    #[arg(long, value_name = "ID=HOST:PORT,...")]
    initial_cluster: Option<String>,
    /// The default user's password (clients `AUTH` with it), or `#` and its
    /// SHA-256 in hex. Prefer `IDEM_REQUIREPASS` or the config file: flags
    /// show in the process list.
    #[arg(long, value_name = "PASSWORD")]
    requirepass: Option<String>,
    /// A user, as a Redis ACL rule line (`payments on #<sha256> ~payments:*
    /// +@idem`); repeat for more. Prefer the config file or `aclfile`.
    #[arg(long = "user", value_name = "RULES")]
    users: Vec<String>,
    /// A file of users, one `user NAME rules...` line each (`ACL LOAD`
    /// rereads it).
    #[arg(long, value_name = "FILE")]
    aclfile: Option<String>,
    /// yes (default): while anyone may connect without a password, refuse
    /// clients from other hosts; no: accept them.
    #[arg(long, value_name = "yes|no")]
    protected_mode: Option<String>,
    /// Where TLS clients connect (a second listener beside --listen).
    #[arg(long, value_name = "IP:PORT")]
    tls_listen: Option<String>,
    /// Where Prometheus scrapes GET /metrics (plain HTTP, no
    /// authentication: loopback or a trusted network).
    #[arg(long, value_name = "IP:PORT")]
    metrics_listen: Option<String>,
    /// The server's certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<String>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<String>,
    /// The CA that signs client and peer certificates (PEM).
    #[arg(long, value_name = "FILE")]
    tls_ca_cert_file: Option<String>,
    /// Whether TLS clients must present a certificate signed by the CA
    /// (default: yes when a CA is given).
    #[arg(long, value_name = "yes|no|optional")]
    tls_auth_clients: Option<String>,
    /// CN: a client certificate's CN logs the connection in as that ACL
    /// user; off (default).
    #[arg(long, value_name = "CN|off")]
    tls_auth_clients_user: Option<String>,
    /// Peers talk TLS to each other (certificates checked both ways).
    #[arg(long, value_name = "yes|no")]
    tls_cluster: Option<String>,
    /// The address MOVED and CLUSTER SLOTS give TLS clients.
    #[arg(long, value_name = "IP:PORT")]
    tls_advertise: Option<String>,
    /// Configuration file (TOML); `IDEM_CONFIG` also names one.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Runs idemd; a refusal or failure is reported as one line (the error
/// and its causes, each once) and exit code 1. Not as `main`'s `Err`,
/// which prints a multi-line debug form and, with `RUST_BACKTRACE` set, a
/// backtrace: a configuration mistake is not a crash.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idemd: error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined with ": ", leaving out a cause whose text
/// the message before it already ends with (errors that print their
/// source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.ends_with(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let path = args
        .config
        .or_else(|| std::env::var_os("IDEM_CONFIG").map(PathBuf::from));
    let mut raw = match &path {
        Some(p) => RawConfig::from_file(p)?,
        None => RawConfig::default(),
    };
    let ignored = raw.apply_env(std::env::vars().filter(|(k, _)| k != "IDEM_CONFIG"))?;
    // Flags override the file and the environment, key by key.
    let flags = [
        ("listen", args.listen),
        ("engine", args.engine),
        ("data_dir", args.data_dir),
        ("node_id", args.node_id.map(|n| n.to_string())),
        ("peer_listen", args.peer_listen),
        ("advertise", args.advertise),
        ("peer_advertise", args.peer_advertise),
        ("initial_cluster", args.initial_cluster),
        ("requirepass", args.requirepass),
        ("protected_mode", args.protected_mode),
        ("aclfile", args.aclfile),
        ("tls_listen", args.tls_listen),
        ("metrics_listen", args.metrics_listen),
        ("tls_cert_file", args.tls_cert_file),
        ("tls_key_file", args.tls_key_file),
        ("tls_ca_cert_file", args.tls_ca_cert_file),
        ("tls_auth_clients", args.tls_auth_clients),
        ("tls_auth_clients_user", args.tls_auth_clients_user),
        ("tls_cluster", args.tls_cluster),
        ("tls_advertise", args.tls_advertise),
    ];
    if !args.users.is_empty() {
        // Flags replace the users of the file and the environment.
        raw.users.clear();
        for rule in &args.users {
            raw.set("users", rule)?;
        }
    }
    for (key, value) in flags {
        if let Some(v) = value {
            raw.set(key, &v)?;
        }
    }
    let config = raw.validate()?;
    // RUST_LOG overrides `log`; one that does not parse is an error, as a
    // bad `log` is (it was ignored in silence).
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v)
            .with_context(|| format!("invalid log filter in RUST_LOG: '{v}'"))?,
        _ => EnvFilter::try_new(&config.log).context("invalid log filter")?,
    };
    // Colours only on a terminal: a log file or a journal gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    for name in ignored {
        tracing::warn!(variable = %name, "ignoring an IDEM_ environment variable that names no setting");
    }

    // One worker: a single-threaded runtime, like an event loop (no work
    // stealing, no cross-thread wake-ups). More: the work-stealing runtime.
    // (`worker_threads` 0 is resolved by then: one per CPU, one on a small
    // machine.)
    tracing::debug!(
        worker_threads = config.worker_threads,
        "starting the runtime"
    );
    let mut builder = match config.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    builder.on_thread_park(collect_if_asked);
    builder.on_thread_start(idem_server::connection::reserve_read_buffer);
    if config.worker_threads == 1 {
        // The single worker is this thread.
        idem_server::connection::reserve_read_buffer();
    }
    idem_server::reclaim::set_collector(collect_if_asked);
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async move {
        let listen = config.listen;
        let server = Server::bind(config)
            .await
            .with_context(|| format!("cannot start idemd on {listen}"))?;
        // Tests and scripts started with port 0 read the bound address here.
        println!("idemd listening on {}", server.local_addr());
        tokio::spawn(return_memory_when_quiet(server.node().clone()));
        tokio::spawn(reload_tls_on_sighup(server.node().clone()));
        tokio::spawn(exit_if_the_raft_core_fails(server.node().clone()));
        server.run(shutdown_signal()).await.context("server failed")
    })
}

/// A Raft core stopped by an error (a snapshot that cannot be installed
/// or read, say) takes no more entries and leads no more: rather than
/// answer errors until someone notices, idemd exits with code 70 (as when
/// its log cannot be written), so that its supervisor restarts it and its
/// operator sees why. A restart recovers what the node had on disk.
async fn exit_if_the_raft_core_fails(node: idem_server::node::Node) {
    let Some(engine) = node.engine().raft_engine() else {
        return;
    };
    let error = engine.failure().await;
    tracing::error!(%error, "the raft core stopped on an error: exiting");
    eprintln!("idemd: fatal: the raft core stopped: {error}");
    std::process::exit(70);
}

/// SIGHUP rereads the TLS certificate, key and CA files (as `CONFIG
/// RELOAD-TLS` does).
async fn reload_tls_on_sighup(node: idem_server::node::Node) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        if node.config().tls.is_some() {
            let _ = idem_server::admin::reload_tls(&node);
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
