//! Runs the conformance suite against a server.
//!
//! `cargo run -p idem-client --example conformance [HOST:PORT]`

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7379".into());
    match idem_client::conformance::run(&addr).await {
        Ok(report) => {
            println!("{report}");
            std::process::exit(if report.passed() { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("cannot reach {addr}: {e}");
            std::process::exit(2);
        }
    }
}
