//! TLS for clients over real sockets: mutual TLS with and without a client
//! certificate, a wrong CA refused, optional client certificates, a
//! certificate's CN as the ACL user, certificate reload (CONFIG RELOAD-TLS
//! and SIGHUP), plain and TLS listeners together, and redis-cli --tls and
//! redis-rs rediss:// against it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use idem_protocol::{Frame, Limits, Version, decode, encode};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::cluster::free_port;
use crate::support::pki::{Ca, Issued};
use crate::support::*;

/// A TLS client connection speaking RESP.
struct TlsConn {
    stream: tokio_rustls::client::TlsStream<TcpStream>,
    buf: BytesMut,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration trusting `ca_pem`, presenting `cert` if given.
fn client_config(ca_pem: &str, cert: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match cert {
        Some(c) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(c.cert_pem.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    })
}

impl TlsConn {
    /// Connects and completes the handshake.
    async fn connect(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<TlsConn> {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").unwrap();
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        Ok(TlsConn {
            stream,
            buf: BytesMut::new(),
        })
    }

    /// Sends a command and reads its reply (an error if the connection
    /// fails: with TLS 1.3 a refused client certificate shows here).
    async fn cmd(&mut self, args: &[&str]) -> std::io::Result<Frame> {
        let mut out = BytesMut::new();
        encode(&cmd_frame(args), Version::Resp2, &mut out);
        self.stream.write_all(&out).await?;
        self.stream.flush().await?;
        loop {
            if let Some(f) = decode(&mut self.buf, &Limits::for_replies()).unwrap() {
                return Ok(f);
            }
            let n =
                tokio::time::timeout(Duration::from_secs(10), self.stream.read_buf(&mut self.buf))
                    .await
                    .map_err(|_| std::io::Error::other("no reply in 10 s"))??;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// Whether a client with `config` gets PONG from `addr`.
async fn pings(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> bool {
    match TlsConn::connect(addr, config).await {
        Ok(mut c) => matches!(c.cmd(&["PING"]).await, Ok(f) if f == Frame::simple("PONG")),
        Err(_) => false,
    }
}

struct Setup {
    _dir: DataDir,
    ca: Ca,
    server: Idemd,
    tls: SocketAddr,
    dir: std::path::PathBuf,
}

/// idemd with a plain and a TLS listener, certificates of a fresh CA, and
/// `extra` arguments.
async fn start(name: &str, extra: &[&str]) -> Setup {
    let dir = DataDir::new(name);
    std::fs::create_dir_all(&dir.0).unwrap();
    let ca = Ca::new("Idem test CA");
    let ca_file = ca.write(&dir.0, "ca.crt");
    let cert = ca.server(&dir.0, "server");
    let tls = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let tls_s = tls.to_string();
    let mut args = vec![
        "--tls-listen",
        &tls_s,
        "--tls-cert-file",
        cert.cert_file.to_str().unwrap(),
        "--tls-key-file",
        cert.key_file.to_str().unwrap(),
        "--tls-ca-cert-file",
        ca_file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let server = Idemd::start_with(&[], &args).await;
    let path = dir.0.clone();
    Setup {
        _dir: dir,
        ca,
        server,
        tls,
        dir: path,
    }
}

#[tokio::test]
async fn mutual_tls_requires_a_certificate_of_the_ca() {
    let s = start("tls-mutual", &[]).await;
    let client = s.ca.client(&s.dir, "svc");
    // With a certificate of the CA: served, beside the plain listener.
    let mut c = TlsConn::connect(s.tls, client_config(&s.ca.pem, Some(&client)))
        .await
        .unwrap();
    assert_eq!(c.cmd(&["PING"]).await.unwrap(), Frame::simple("PONG"));
    let fence = match claim(c.cmd(&["CLAIM", "tls-key"]).await.unwrap()) {
        idem_protocol::ClaimReply::Acquired { fence } => fence,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        c.cmd(&["COMPLETE", "tls-key", &fence.to_string(), "v"])
            .await
            .unwrap(),
        ok()
    );
    let mut plain = s.server.conn().await;
    assert!(format!("{:?}", plain.cmd(&["SETTLE", "tls-key"]).await).contains("COMPLETED"));
    // Without a certificate: refused.
    assert!(!pings(s.tls, client_config(&s.ca.pem, None)).await);
    // A certificate of another CA: refused.
    let other = Ca::new("someone else");
    let stranger = other.client(&s.dir, "stranger");
    assert!(!pings(s.tls, client_config(&s.ca.pem, Some(&stranger))).await);
    // A client that trusts another CA refuses the server.
    let e = TlsConn::connect(s.tls, client_config(&other.pem, Some(&client))).await;
    assert!(
        e.is_err(),
        "a server certificate of an unknown CA was accepted"
    );
    // Plain text on the TLS port: no handshake, counted.
    let mut raw = TcpStream::connect(s.tls).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was not closed");
    assert!(!String::from_utf8_lossy(&got).contains("PONG"));
    assert!(info_field(&mut plain, "tls_handshake_failures").await >= 3);
    // The operator learns why (the first failure, the client without a
    // certificate) from the log: one line for the lot, not one each.
    s.server
        .logged("TLS handshake failed", Duration::from_secs(5))
        .await;
    // Every failure above is in by now (each was answered): still one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = s
        .server
        .logged("TLS handshake failed", Duration::ZERO)
        .await;
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("client=127.0.0.1:")
            && lines[0].contains("failures=1")
            && lines[0].contains("certificate"),
        "{}",
        lines[0]
    );
}

#[tokio::test]
async fn optional_client_certificates_and_the_cn_as_the_acl_user() {
    let s = start(
        "tls-cn",
        &[
            "--tls-auth-clients",
            "optional",
            "--tls-auth-clients-user",
            "CN",
            "--user",
            "default off",
            "--user",
            "tenant-a on >a-pw ~tenant-a:* +@idem +@connection",
        ],
    )
    .await;
    // No certificate: connected, but as nobody (the default user is off).
    let mut anon = TlsConn::connect(s.tls, client_config(&s.ca.pem, None))
        .await
        .unwrap();
    let r = anon.cmd(&["CLAIM", "tenant-a:1"]).await.unwrap();
    assert!(format!("{r:?}").contains("NOAUTH"), "{r:?}");
    // A certificate whose CN is an ACL user: logged in as it.
    let a = s.ca.client(&s.dir, "tenant-a");
    let mut c = TlsConn::connect(s.tls, client_config(&s.ca.pem, Some(&a)))
        .await
        .unwrap();
    assert_eq!(
        c.cmd(&["ACL", "WHOAMI"]).await.unwrap(),
        Frame::Bulk("tenant-a".into())
    );
    assert!(matches!(
        claim(c.cmd(&["CLAIM", "tenant-a:1"]).await.unwrap()),
        idem_protocol::ClaimReply::Acquired { .. }
    ));
    let r = c.cmd(&["CLAIM", "tenant-b:1"]).await.unwrap();
    assert!(format!("{r:?}").contains("NOPERM"), "{r:?}");
    // A CN that names no user: not logged in.
    let b = s.ca.client(&s.dir, "tenant-b");
    let mut c = TlsConn::connect(s.tls, client_config(&s.ca.pem, Some(&b)))
        .await
        .unwrap();
    let r = c.cmd(&["PING"]).await.unwrap();
    assert!(format!("{r:?}").contains("NOAUTH"), "{r:?}");
    assert_eq!(c.cmd(&["AUTH", "tenant-a", "a-pw"]).await.unwrap(), ok());
}

/// Replaces the server certificate with one of `ca`.
fn reissue(s: &Setup, ca: &Ca) {
    let fresh = ca.server(&s.dir, "server");
    assert!(fresh.cert_file.ends_with("server.crt"));
    ca.write(&s.dir, "ca.crt");
}

#[tokio::test]
async fn certificates_are_reloaded_without_a_restart() {
    let s = start("tls-reload", &["--tls-auth-clients", "no"]).await;
    assert!(pings(s.tls, client_config(&s.ca.pem, None)).await);
    let ca2 = Ca::new("Idem test CA 2");
    reissue(&s, &ca2);
    // Not yet reloaded: the old certificate is served.
    assert!(pings(s.tls, client_config(&s.ca.pem, None)).await);
    let mut admin = s.server.conn().await;
    assert_eq!(admin.cmd(&["CONFIG", "RELOAD-TLS"]).await, ok());
    assert!(pings(s.tls, client_config(&ca2.pem, None)).await);
    assert!(!pings(s.tls, client_config(&s.ca.pem, None)).await);
    // A broken file is refused, and the certificate in force stays.
    std::fs::write(s.dir.join("server.key"), "not a key").unwrap();
    let r = admin.cmd(&["CONFIG", "RELOAD-TLS"]).await;
    assert!(format!("{r:?}").contains("server.key"), "{r:?}");
    assert!(pings(s.tls, client_config(&ca2.pem, None)).await);
    // SIGHUP reloads too.
    let ca3 = Ca::new("Idem test CA 3");
    reissue(&s, &ca3);
    let pid = s.server.child.id().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut reloaded = false;
    for _ in 0..50 {
        if pings(s.tls, client_config(&ca3.pem, None)).await {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "SIGHUP did not reload the certificate");
    // The server is still up on both listeners.
    assert_eq!(admin.cmd(&["PING"]).await, Frame::simple("PONG"));
}

#[tokio::test]
async fn bad_tls_settings_stop_the_start() {
    let run = refused_start;
    let e = run(&["--tls-listen", "127.0.0.1:7380"]);
    assert!(e.contains("tls_cert_file"), "{e}");
    let e = run(&[
        "--tls-listen",
        "127.0.0.1:7380",
        "--tls-cert-file",
        "/nonexistent.crt",
        "--tls-key-file",
        "/nonexistent.key",
    ]);
    assert!(e.contains("/nonexistent.crt"), "{e}");
    // A good certificate and a missing key: the key's setting is named.
    let dir = DataDir::new("tls-missing-key");
    std::fs::create_dir_all(&dir.0).unwrap();
    let cert = Ca::new("Idem test CA").server(&dir.0, "server");
    let e = run(&[
        "--tls-listen",
        "127.0.0.1:7380",
        "--tls-cert-file",
        cert.cert_file.to_str().unwrap(),
        "--tls-key-file",
        "/nonexistent.key",
    ]);
    assert!(
        e.contains("invalid value for tls_key_file") && e.contains("/nonexistent.key"),
        "{e}"
    );
    let e = run(&[
        "--tls-listen",
        "127.0.0.1:7380",
        "--tls-cert-file",
        "a",
        "--tls-key-file",
        "b",
        "--tls-auth-clients",
        "yes",
    ]);
    assert!(e.contains("tls_ca_cert_file"), "{e}");
    let e = run(&["--tls-listen", "nowhere"]);
    assert!(e.contains("tls_listen"), "{e}");
    let e = run(&[
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert-file",
        "a",
        "--tls-key-file",
        "b",
    ]);
    assert!(e.contains("tls_listen") && e.contains("port"), "{e}");
    let e = run(&["--tls-advertise", "127.0.0.1:7380"]);
    assert!(e.contains("tls_listen"), "{e}");
    let e = run(&[
        "--tls-listen",
        "127.0.0.1:7380",
        "--tls-cert-file",
        "a",
        "--tls-key-file",
        "b",
        "--tls-auth-clients-user",
        "CN",
    ]);
    assert!(e.contains("tls_auth_clients_user"), "{e}");
}

/// redis-cli --tls and redis-rs rediss:// with client certificates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_redis_rs_speak_tls_to_idemd() {
    let s = start("tls-redis", &[]).await;
    let client = s.ca.client(&s.dir, "svc");
    let ca_file = s.dir.join("ca.crt");
    if crate::t07_redis_tools::tool("redis-cli").is_some() {
        let out = redis_cli_tls(s.tls, &ca_file, &client, &["CLAIM", "cli-tls"]);
        assert_eq!(out.lines().next(), Some("ACQUIRED"), "{out}");
    }
    let url = format!("rediss://localhost:{}/", s.tls.port());
    let certs = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: client.cert_pem.clone().into_bytes(),
            client_key: client.key_pem.clone().into_bytes(),
        }),
        root_cert: Some(s.ca.pem.clone().into_bytes()),
    };
    let c = redis::Client::build_with_tls(url.as_str(), certs).unwrap();
    let mut con = c.get_multiplexed_async_connection().await.unwrap();
    let claimed: Vec<redis::Value> = redis::cmd("CLAIM")
        .arg("rs-tls")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(claimed[0], redis::Value::SimpleString("ACQUIRED".into()));
}

fn redis_cli_tls(addr: SocketAddr, ca: &Path, client: &Issued, args: &[&str]) -> String {
    let port = addr.port().to_string();
    let tls = [
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "--tls",
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        client.cert_file.to_str().unwrap(),
        "--key",
        client.key_file.to_str().unwrap(),
    ];
    redis_cli(&[&tls[..], args].concat())
}

/// Peers talk TLS (`tls_cluster`): the cluster forms, replicates and fails
/// over; a peer with a certificate of another CA, or in clear text, is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_talks_tls_between_peers() {
    use crate::support::cluster::Cluster;
    let dir = DataDir::new("tls-cluster");
    std::fs::create_dir_all(&dir.0).unwrap();
    let ca = Ca::new("Idem cluster CA");
    let ca_file = ca.write(&dir.0, "ca.crt");
    let tls_ports: Vec<u16> = (1..=3).map(|_| free_port()).collect();
    let env: Vec<Vec<(String, String)>> = (1..=3)
        .map(|id| {
            let cert = ca.server(&dir.0, &format!("node-{id}"));
            vec![
                (
                    "IDEM_TLS_LISTEN".to_owned(),
                    format!("127.0.0.1:{}", tls_ports[id - 1]),
                ),
                ("IDEM_TLS_AUTH_CLIENTS".to_owned(), "no".to_owned()),
                ("IDEM_TLS_CLUSTER".to_owned(), "yes".to_owned()),
                (
                    "IDEM_TLS_CERT_FILE".to_owned(),
                    cert.cert_file.display().to_string(),
                ),
                (
                    "IDEM_TLS_KEY_FILE".to_owned(),
                    cert.key_file.display().to_string(),
                ),
                (
                    "IDEM_TLS_CA_CERT_FILE".to_owned(),
                    ca_file.display().to_string(),
                ),
            ]
        })
        .collect();
    let env_of = |id: u64| env[id as usize - 1].clone();
    let mut c = Cluster::start_each("tls-cluster", 3, env_of).await;
    let l = c.leader().await;
    let mut conn = c.members[l].conn().await;
    let fence = conn.acquire(&["CLAIM", "tls-peer-key"]).await;
    assert_eq!(
        conn.cmd(&["COMPLETE", "tls-peer-key", &fence.to_string(), "v"])
            .await,
        ok()
    );
    // Fail over: the record is on the new leader.
    c.members[l].kill().await;
    let l2 = c.leader().await;
    assert_ne!(l2, l);
    let mut conn = c.members[l2].conn().await;
    let settled = conn.cmd(&["SETTLE", "tls-peer-key"]).await;
    assert!(format!("{settled:?}").contains("COMPLETED"), "{settled:?}");
    // Redirects name the leader's address of the client's kind: its TLS
    // listener for TLS clients, its plain one for the others.
    let f = (0..3).find(|&i| i != l && i != l2).unwrap();
    let leader_tls = format!("127.0.0.1:{}", tls_ports[c.members[l2].id as usize - 1]);
    let follower_tls = SocketAddr::from(([127, 0, 0, 1], tls_ports[c.members[f].id as usize - 1]));
    let mut t = TlsConn::connect(follower_tls, client_config(&ca.pem, None))
        .await
        .unwrap();
    let moved = t.cmd(&["CLAIM", "tls-moved"]).await.unwrap();
    let text = format!("{moved:?}");
    assert!(
        text.contains("MOVED") && text.contains(&leader_tls),
        "{text}"
    );
    let mut plain = c.members[f].conn().await;
    let moved = plain.cmd(&["CLAIM", "tls-moved"]).await;
    let text = format!("{moved:?}");
    assert!(
        text.contains(&c.members[l2].client.to_string()) && !text.contains('+'),
        "{text}"
    );
    let slots = format!("{:?}", t.cmd(&["CLUSTER", "SLOTS"]).await.unwrap());
    assert!(
        slots.contains(&tls_ports[c.members[l2].id as usize - 1].to_string()),
        "{slots}"
    );
    // The old leader comes back over TLS and catches up.
    let id = c.members[l].id;
    let e: Vec<(&str, &str)> = env[id as usize - 1]
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    c.members[l].start(None, &e).await;
    let applied = |i: usize| {
        let m = &c.members[i];
        async move {
            m.info("raft_applied_index")
                .await
                .parse::<u64>()
                .unwrap_or(0)
        }
    };
    let want = applied(l2).await;
    let mut caught_up = false;
    for _ in 0..100 {
        if applied(l).await >= want {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(caught_up, "the restarted node did not catch up over TLS");
    // A peer with a certificate of another CA is refused in the handshake.
    let peer = c.members[l2].peer;
    let other = Ca::new("another CA");
    let stranger = other.server(&dir.0, "stranger");
    let refused = match TlsConn::connect(peer, client_config(&ca.pem, Some(&stranger))).await {
        Err(e) => e.to_string(),
        Ok(mut t) => t
            .cmd(&["PING"])
            .await
            .map(|f| format!("{f:?}"))
            .unwrap_or_else(|e| e.to_string()),
    };
    assert!(refused.contains("alert"), "{refused}");
    // Clear text to the peer port gets no answer but a closed connection.
    let mut raw = TcpStream::connect(peer).await.unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut got)).await;
    assert!(read.is_ok() && !String::from_utf8_lossy(&got).contains("PONG"));
}

/// idem-client over TLS: `idems://` with credentials, the CA and a client
/// certificate; a server it cannot trust is a TLS error, not retried.
#[tokio::test]
async fn idem_client_speaks_tls() {
    use idem_client::{ClaimOutcome, Client, ClientConfig, ErrorKind};
    let s = start(
        "tls-client",
        &[
            "--user",
            "default off",
            "--user",
            "svc on >svc-pw ~* +@idem +@connection",
        ],
    )
    .await;
    let cert = s.ca.client(&s.dir, "svc");
    let config = || {
        ClientConfig::default()
            .tls_ca_pem(s.ca.pem.clone())
            .tls_client_cert_pem(cert.cert_pem.clone(), cert.key_pem.clone())
    };
    let url = format!("idems://svc:svc-pw@localhost:{}", s.tls.port());
    let c = Client::connect_with_config(url.as_str(), config())
        .await
        .unwrap();
    let ClaimOutcome::Acquired(claim) = c.claim("client-tls").await.unwrap() else {
        panic!("not acquired")
    };
    claim.complete(b"paid".to_vec()).await.unwrap();
    let mut plain = s.server.conn().await;
    assert_eq!(plain.cmd(&["AUTH", "svc", "svc-pw"]).await, ok());
    assert!(format!("{:?}", plain.cmd(&["SETTLE", "client-tls"]).await).contains("paid"));
    // By IP address, the name the certificate carries too.
    let by_ip = format!("idems://svc:svc-pw@127.0.0.1:{}", s.tls.port());
    let c = Client::connect_with_config(by_ip.as_str(), config())
        .await
        .unwrap();
    assert!(c.claim("client-tls-2").await.is_ok());
    // A CA that did not sign the server's certificate.
    let other = Ca::new("not the server's");
    let e = Client::connect_with_config(
        url.as_str(),
        ClientConfig::default().tls_ca_pem(other.pem.clone()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(!e.is_retryable());
    // The plain port does not speak TLS: a TLS error too, not a hang.
    let to_plain = format!("idems://svc:svc-pw@{}", s.server.addr);
    let e = Client::connect_with_config(to_plain.as_str(), config())
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Tls | ErrorKind::Io), "{e}");
}
