//! Test certificates: a CA, server certificates for 127.0.0.1 and
//! localhost, and client certificates with a CN, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority that signs test certificates.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, PEM, and where they were written.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl Ca {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// Writes the CA certificate to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.pem).unwrap();
        p
    }

    fn issue(&self, dir: &Path, name: &str, sans: Vec<String>, cn: &str, client: bool) -> Issued {
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = if client {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let issued = Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_file: dir.join(format!("{name}.crt")),
            key_file: dir.join(format!("{name}.key")),
        };
        std::fs::write(&issued.cert_file, &issued.cert_pem).unwrap();
        std::fs::write(&issued.key_file, &issued.key_pem).unwrap();
        issued
    }

    /// A server (and peer) certificate for 127.0.0.1 and localhost.
    pub fn server(&self, dir: &Path, name: &str) -> Issued {
        self.issue(
            dir,
            name,
            vec!["127.0.0.1".into(), "localhost".into()],
            name,
            false,
        )
    }

    /// A client certificate whose CN is `cn`.
    pub fn client(&self, dir: &Path, cn: &str) -> Issued {
        self.issue(dir, cn, Vec::new(), cn, true)
    }
}
