//! `idemd`: run the Idem idempotency server.
//!
//! With no arguments it serves on 127.0.0.1:7379 with the durable raft
//! engine (data in `./idem-data`) and default limits. Configuration: `--config FILE` (TOML, see
//! `config/idem.toml`), then `IDEM_*` environment variables, then flags.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use idem_server::config::RawConfig;
use idem_server::server::Server;
use tracing_subscriber::EnvFilter;

/// mimalloc: size classes that fit the store's small records closely and
/// no per-allocation header, so resident memory tracks live data.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often a quiet server gives freed memory back.
const RETURN_MEMORY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The one exception to the workspace's `unsafe_code` ban: mimalloc gives
/// pages freed by a burst back to the system only on its next use after a
/// delay, so a server that goes quiet after FORGET or expiry would keep
/// them indefinitely. Once a second, if no command ran since the last look
/// (and something ran before), this asks mimalloc to collect.
///
/// Why it is sound: `mi_collect` takes no pointers and no state of ours;
/// it only walks mimalloc's own structures, which are thread-safe, and it
/// is mimalloc that serves every allocation of this process (the global
/// allocator above).
async fn return_memory_when_quiet(commands: impl Fn() -> u64) {
    let mut seen = commands();
    let mut collected = true;
    loop {
        tokio::time::sleep(RETURN_MEMORY_EVERY).await;
        let now = commands();
        if now != seen {
            seen = now;
            collected = false;
        } else if !collected {
            collected = true;
            #[allow(unsafe_code)]
            // SAFETY: see above: no arguments but a flag, no Rust state.
            unsafe {
                libmimalloc_sys::mi_collect(false);
            }
        }
    }
}

/// The Idem idempotency server.
#[derive(Parser, Debug)]
#[command(name = "idemd", version, about)]
struct Args {
    /// Address to listen on, HOST:PORT (default 127.0.0.1:7379).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Storage engine: raft (default: a durable log on disk) or memory
    /// (nothing survives a restart).
    #[arg(long, value_name = "ENGINE")]
    engine: Option<String>,
    /// Data directory of the raft engine (default ./idem-data).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
    /// Configuration file (TOML); `IDEM_CONFIG` also names one.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let path = args
        .config
        .or_else(|| std::env::var_os("IDEM_CONFIG").map(PathBuf::from));
    let mut raw = match &path {
        Some(p) => RawConfig::from_file(p)?,
        None => RawConfig::default(),
    };
    let ignored = raw.apply_env(std::env::vars().filter(|(k, _)| k != "IDEM_CONFIG"))?;
    if let Some(l) = args.listen {
        raw.listen = l;
    }
    if let Some(d) = args.data_dir {
        raw.data_dir = d;
    }
    if let Some(e) = args.engine {
        raw.engine = e;
    }
    let config = raw.validate()?;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log))
        .context("invalid log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    for name in ignored {
        tracing::warn!(variable = %name, "ignoring an IDEM_ environment variable that names no setting");
    }

    // One worker: a single-threaded runtime, like an event loop (no work
    // stealing, no cross-thread wake-ups). More (or 0, one per CPU): the
    // work-stealing runtime.
    let mut builder = match config.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if config.worker_threads > 1 {
        builder.worker_threads(config.worker_threads);
    }
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
        let node = server.node().clone();
        tokio::spawn(return_memory_when_quiet(move || {
            node.metrics()
                .commands
                .load(std::sync::atomic::Ordering::Relaxed)
        }));
        server.run(shutdown_signal()).await.context("server failed")
    })
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
