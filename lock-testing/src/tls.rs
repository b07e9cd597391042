//! Certificates for TLS servers: a certificate authority, and a server's certificate signed by
//! it, as PEM files in the server's directory. A server makes a CA of its own unless it is given
//! one ([`TlsCa`]), as the nodes of a TLS cluster are, so that they trust each other.

use std::fmt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::TestingError;

/// A certificate authority that signs server certificates: one per TLS server, or one shared
/// by every node of a TLS cluster.
pub(super) struct TlsCa {
    pem: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for TlsCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCa").finish_non_exhaustive()
    }
}

impl TlsCa {
    /// Makes a new self-signed CA.
    pub(super) fn new() -> Result<TlsCa, TestingError> {
        make_ca().map_err(certificate_error)
    }

    /// The CA certificate (PEM), for clients to trust.
    pub(super) fn pem(&self) -> &[u8] {
        &self.pem
    }
}

/// The PEM files of a TLS server, and the CA certificate in memory for clients.
#[derive(Debug)]
pub(super) struct TlsFiles {
    ca_pem: Vec<u8>,
    ca_path: PathBuf,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl TlsFiles {
    /// Makes a CA and a server certificate for `localhost` and `127.0.0.1` signed by it, and
    /// writes `ca.crt`, `server.crt` and `server.key` into `dir`.
    pub(super) fn create(dir: &Path) -> Result<TlsFiles, TestingError> {
        TlsFiles::create_signed_by(dir, &TlsCa::new()?)
    }

    /// Makes a server certificate for `localhost` and `127.0.0.1` signed by `ca`, and writes
    /// `ca.crt`, `server.crt` and `server.key` into `dir`.
    pub(super) fn create_signed_by(dir: &Path, ca: &TlsCa) -> Result<TlsFiles, TestingError> {
        let (cert_pem, key_pem) = make_server_certificate(ca).map_err(certificate_error)?;
        let files = TlsFiles {
            ca_pem: ca.pem.clone(),
            ca_path: dir.join("ca.crt"),
            cert_path: dir.join("server.crt"),
            key_path: dir.join("server.key"),
        };
        std::fs::write(&files.ca_path, &files.ca_pem)?;
        std::fs::write(&files.cert_path, cert_pem)?;
        std::fs::write(&files.key_path, key_pem)?;
        Ok(files)
    }

    pub(super) fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    pub(super) fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    pub(super) fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    pub(super) fn key_path(&self) -> &Path {
        &self.key_path
    }
}

fn certificate_error(err: rcgen::Error) -> TestingError {
    TestingError::Certificate(Box::new(err))
}

fn make_ca() -> Result<TlsCa, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "distlock testing CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    Ok(TlsCa {
        pem: ca_cert.pem().into_bytes(),
        issuer: Issuer::new(ca_params, ca_key),
    })
}

/// A client certificate for `user` (its common name) signed by `ca`, and its key, as PEMs:
/// for servers that ask clients for one (PostgreSQL's `clientcert`).
pub(super) fn make_client_identity(
    ca: &TlsCa,
    user: &str,
) -> Result<(String, String), TestingError> {
    let make = || -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &ca.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    make().map_err(certificate_error)
}

/// Returns the PEMs of a server certificate signed by `ca` and of the server's key.
///
/// The certificate is also good for client authentication: the nodes of a TLS cluster present
/// it when they connect to each other (cluster bus, replication, `MIGRATE`).
fn make_server_certificate(ca: &TlsCa) -> Result<(String, String), rcgen::Error> {
    let server_key = KeyPair::generate()?;
    let mut server_params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    server_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    server_params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let server_cert = server_params.signed_by(&server_key, &ca.issuer)?;
    Ok((server_cert.pem(), server_key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_ca_and_a_server_certificate() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let files = TlsFiles::create(dir.path())?;
        let ca = std::fs::read(files.ca_path())?;
        assert_eq!(ca, files.ca_pem());
        assert!(ca.starts_with(b"-----BEGIN CERTIFICATE-----"));
        let cert = std::fs::read_to_string(files.cert_path())?;
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(cert.as_bytes(), ca.as_slice());
        let key = std::fs::read_to_string(files.key_path())?;
        assert!(key.contains("PRIVATE KEY"));
        Ok(())
    }

    #[test]
    fn servers_given_one_ca_share_it() -> Result<(), Box<dyn std::error::Error>> {
        let ca = TlsCa::new()?;
        let (first, second) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let first = TlsFiles::create_signed_by(first.path(), &ca)?;
        let second = TlsFiles::create_signed_by(second.path(), &ca)?;
        assert_eq!(first.ca_pem(), ca.pem());
        assert_eq!(second.ca_pem(), ca.pem());
        assert_eq!(std::fs::read(second.ca_path())?, ca.pem());
        assert_ne!(
            std::fs::read(first.cert_path())?,
            std::fs::read(second.cert_path())?
        );
        Ok(())
    }
}
