//! The rustls client configuration distlock's own TLS connections use (the
//! Redis direct lane, PostgreSQL): the CA given to the builder or else the
//! system's roots, the client identity when given, rustls's ring provider
//! (the one redis's `tokio-rustls-comp` already compiles in). The server's
//! certificate is always verified, its name included.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSettings;
use crate::error::LockError;

/// Trusts `tls.ca_pem` (every certificate in it) or, without one, the
/// system's roots, and presents `tls.client_identity` when given. `store`
/// names the store in errors ("PostgreSQL TLS", "Redis TLS").
pub(crate) fn client_config(
    tls: &TlsSettings,
    store: &str,
) -> Result<rustls::ClientConfig, LockError> {
    let invalid = |what: String| LockError::InvalidConfig(format!("{store}: {what}"));
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| invalid(format!("the CA (tls_ca_pem): {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| invalid(format!("the CA (tls_ca_pem): {e}")))?;
            }
            if roots.is_empty() {
                return Err(invalid(
                    "the CA (tls_ca_pem) holds no PEM certificate".to_owned(),
                ));
            }
        }
        None => {
            // Unreadable system certificates are skipped, as redis does:
            // the handshake then fails naming the unknown issuer.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots);
    match &tls.client_identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert_pem, key_pem)) => {
            let chain = CertificateDer::pem_slice_iter(cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("the client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key_pem)
                .map_err(|e| invalid(format!("the client key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(format!("the client certificate: {e}")))
        }
    }
}
