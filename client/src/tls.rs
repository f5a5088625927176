//! TLS (feature `tls`): the rustls client configuration built once from
//! [`ClientConfig`](crate::ClientConfig)'s options.

use std::sync::Arc;

use crate::config::TlsOptions;
use crate::error::{Error, ErrorKind, Result};

/// What connections need to talk TLS.
#[derive(Clone)]
pub(crate) struct Tls {
    #[cfg(feature = "tls")]
    connector: tokio_rustls::TlsConnector,
    #[cfg(feature = "tls")]
    server_name: Option<String>,
}

fn invalid(why: String) -> Error {
    Error::new(ErrorKind::InvalidAddress, why)
}

impl Tls {
    /// The TLS setup `o` asks for, if any.
    pub(crate) fn new(o: &TlsOptions) -> Result<Option<Arc<Tls>>> {
        if !o.enabled {
            return Ok(None);
        }
        Tls::build(o).map(|t| Some(Arc::new(t)))
    }

    #[cfg(not(feature = "tls"))]
    fn build(_: &TlsOptions) -> Result<Tls> {
        Err(invalid(
            "TLS (idems:// or ClientConfig::tls) needs idem-client's `tls` feature".into(),
        ))
    }

    #[cfg(feature = "tls")]
    fn build(o: &TlsOptions) -> Result<Tls> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let Some(ca) = &o.ca_pem else {
            return Err(invalid(
                "TLS needs the CA that signs the server's certificate (ClientConfig::tls_ca_pem)"
                    .into(),
            ));
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca) {
            let c = c.map_err(|e| invalid(format!("tls_ca_pem: {e}")))?;
            roots
                .add(c)
                .map_err(|e| invalid(format!("tls_ca_pem: {e}")))?;
        }
        if roots.is_empty() {
            return Err(invalid("tls_ca_pem: no certificate in it".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_root_certificates(roots);
        let config = match &o.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| invalid(format!("client certificate: {e}")))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| invalid(format!("client key: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| invalid(format!("client certificate: {e}")))?
            }
        };
        Ok(Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name: o.server_name.clone(),
        })
    }

    /// Completes the TLS handshake over `stream` to `addr` (`host:port`).
    #[cfg(feature = "tls")]
    pub(crate) async fn connect(
        &self,
        addr: &str,
        stream: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        use rustls_pki_types::ServerName;
        let host = match &self.server_name {
            Some(n) => n.as_str(),
            None => addr
                .rsplit_once(':')
                .map_or(addr, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']'),
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| invalid(format!("'{host}' is not a name for TLS: {e}")))?;
        self.connector
            .connect(name, stream)
            .await
            .map_err(Error::io)
    }
}
