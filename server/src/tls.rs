//! TLS for clients and peers (rustls with ring): certificates loaded from
//! PEM files, reloaded without a restart (`CONFIG RELOAD-TLS`, SIGHUP),
//! client certificates verified against the configured CA, and a client
//! certificate's CN as the ACL user it logs in as.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Whether clients must present a certificate (`tls_auth_clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthClients {
    /// A certificate signed by the CA is required.
    Yes,
    /// None is asked for.
    No,
    /// One is asked for; without one the client connects anyway.
    Optional,
}

/// The TLS settings, validated.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// Where TLS clients connect (`tls_listen`); `None`: peers only.
    pub listen: Option<SocketAddr>,
    /// The certificate chain (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The CA that signs client and peer certificates (PEM).
    pub ca_cert_file: Option<PathBuf>,
    /// Whether clients must present a certificate.
    pub auth_clients: AuthClients,
    /// A client certificate's CN logs the connection in as that ACL user.
    pub auth_clients_user_cn: bool,
    /// Peers talk TLS to each other (`tls_cluster`).
    pub cluster: bool,
}

/// The loaded configurations, swapped whole on reload.
#[derive(Debug)]
struct Loaded {
    server: Arc<rustls::ServerConfig>,
    /// For connecting to peers (with this node's certificate).
    peer_client: Option<Arc<rustls::ClientConfig>>,
    /// For accepting peers (a certificate always required).
    peer_server: Option<Arc<rustls::ServerConfig>>,
}

/// TLS state of a node: its settings and the configurations in force.
#[derive(Debug)]
pub struct Tls {
    settings: TlsSettings,
    loaded: RwLock<Loaded>,
}

/// Why the TLS files could not be loaded, and the setting at fault.
#[derive(Debug)]
pub struct TlsError {
    /// The config key to fix (`tls_cert_file`, `tls_key_file`, ...).
    pub key: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Blames `key` for an error.
fn at(key: &'static str) -> impl Fn(String) -> TlsError {
    move |reason| TlsError { key, reason }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("bad certificate in {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a private key from {}: {e}", path.display()))
}

fn read_roots(path: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots
            .add(c)
            .map_err(|e| format!("bad CA certificate in {}: {e}", path.display()))?;
    }
    Ok(Arc::new(roots))
}

impl TlsSettings {
    fn server_config(
        &self,
        auth: AuthClients,
        certs: &[CertificateDer<'static>],
        key: &PrivateKeyDer<'static>,
        roots: Option<&Arc<RootCertStore>>,
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match (auth, roots) {
            (AuthClients::No, _) => builder.with_no_client_auth(),
            (_, None) => return Err("tls_auth_clients needs tls_ca_cert_file".into()),
            (a, Some(roots)) => {
                let v = WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), provider());
                let v = if a == AuthClients::Optional {
                    v.allow_unauthenticated()
                } else {
                    v
                };
                builder.with_client_cert_verifier(v.build().map_err(|e| e.to_string())?)
            }
        };
        let config = builder
            .with_single_cert(certs.to_vec(), key.clone_key())
            .map_err(|e| {
                format!(
                    "{} and {} do not make a certificate and its key: {e}",
                    self.cert_file.display(),
                    self.key_file.display()
                )
            })?;
        Ok(Arc::new(config))
    }

    /// Reads the files and builds the configurations.
    fn load(&self) -> Result<Loaded, TlsError> {
        let certs = read_certs(&self.cert_file).map_err(at("tls_cert_file"))?;
        let key = read_key(&self.key_file).map_err(at("tls_key_file"))?;
        let roots = match &self.ca_cert_file {
            Some(p) => Some(read_roots(p).map_err(at("tls_ca_cert_file"))?),
            None => None,
        };
        let server = self
            .server_config(self.auth_clients, &certs, &key, roots.as_ref())
            .map_err(at("tls_cert_file"))?;
        let (peer_client, peer_server) = if self.cluster {
            let Some(roots) = &roots else {
                return Err(at("tls_cluster")(
                    "needs tls_ca_cert_file (peers verify each other)".into(),
                ));
            };
            let client = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    b.with_root_certificates(Arc::clone(roots))
                        .with_client_auth_cert(certs.clone(), key.clone_key())
                        .map_err(|e| e.to_string())
                })
                .map_err(at("tls_cert_file"))?;
            let server = self
                .server_config(AuthClients::Yes, &certs, &key, Some(roots))
                .map_err(at("tls_cert_file"))?;
            (Some(Arc::new(client)), Some(server))
        } else {
            (None, None)
        };
        Ok(Loaded {
            server,
            peer_client,
            peer_server,
        })
    }
}

impl Tls {
    /// Loads `settings`' files.
    ///
    /// # Errors
    ///
    /// When a file cannot be read or the certificate and key do not match.
    pub fn new(settings: TlsSettings) -> Result<Tls, TlsError> {
        let loaded = settings.load()?;
        Ok(Tls {
            settings,
            loaded: RwLock::new(loaded),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// Reads the certificate, key and CA files again; connections made
    /// from now on use them. On an error the ones in force stay.
    ///
    /// # Errors
    ///
    /// As [`Tls::new`].
    pub fn reload(&self) -> Result<(), String> {
        let loaded = self
            .settings
            .load()
            .map_err(|e| format!("{}: {}", e.key, e.reason))?;
        *self.loaded.write() = loaded;
        Ok(())
    }

    /// The acceptor for client connections.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.loaded.read().server))
    }

    /// The connector to peers (`tls_cluster`).
    pub fn peer_connector(&self) -> Option<tokio_rustls::TlsConnector> {
        self.loaded
            .read()
            .peer_client
            .as_ref()
            .map(|c| tokio_rustls::TlsConnector::from(Arc::clone(c)))
    }

    /// The acceptor of peers (`tls_cluster`): a certificate is required.
    pub fn peer_acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        self.loaded
            .read()
            .peer_server
            .as_ref()
            .map(|c| tokio_rustls::TlsAcceptor::from(Arc::clone(c)))
    }
}

/// The CN of a certificate's subject (DER), if it has exactly one.
pub fn common_name(cert: &[u8]) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version
    // OPTIONAL, serialNumber, signature, issuer, validity, subject, ... } }
    let (_, cert_body, _) = der(cert)?;
    let (_, mut tbs, _) = der(cert_body)?;
    let mut fields = Vec::with_capacity(6);
    while fields.len() < 6 && !tbs.is_empty() {
        let (tag, body, rest) = der(tbs)?;
        fields.push((tag, body));
        tbs = rest;
    }
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let (tag, mut name) = *fields.get(skip + 4)?;
    if tag != 0x30 {
        return None;
    }
    // Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value }
    let mut cn = None;
    while !name.is_empty() {
        let (_, mut set, rest) = der(name)?;
        name = rest;
        while !set.is_empty() {
            let (_, atv, rest) = der(set)?;
            set = rest;
            let (oid_tag, oid, value) = der(atv)?;
            if oid_tag == 0x06 && oid == [0x55, 0x04, 0x03] {
                if cn.is_some() {
                    // Two CNs: which user is meant is not clear.
                    return None;
                }
                let (_, v, _) = der(value)?;
                cn = Some(String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    cn
}

/// One DER element: its tag, its contents, and what follows it.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_name_is_read_from_a_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Idem");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tenant-a");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()).as_deref(), Some("tenant-a"));
        let bare = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        let cert = bare.self_signed(&key).unwrap();
        // rcgen names a certificate "rcgen self signed cert" by default.
        assert_ne!(common_name(cert.der()).as_deref(), Some("tenant-a"));
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        for input in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 1, 2, 3, 4, 5],
            &[0x30, 0x05, 0x30],
        ] {
            assert_eq!(common_name(input), None);
        }
        let mut x = 0u32;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 24) as u8
                })
                .collect();
            let _ = common_name(&bytes);
        }
    }
}
