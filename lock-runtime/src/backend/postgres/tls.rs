//! TLS for PostgreSQL connections through rustls (ring provider): a
//! `MakeTlsConnect` for tokio-postgres on tokio-rustls, which the Redis side
//! already compiles in (through redis's `tokio-rustls-comp`), so the
//! `postgres` and `tls` features together add no crate to the build.
//!
//! The server's certificate is always verified, its name included, against
//! the CA given to the builder or else the system's roots: libpq's
//! `sslmode=require` skips that check, which turns TLS into encryption to
//! whoever answers, and there is no URL form to ask for it here.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::config::TlsSettings;
use crate::error::LockError;

/// Opens TLS sessions with one client configuration: cloned into every
/// connection a manager opens (data, listening, the release at shutdown).
#[derive(Clone)]
pub(crate) struct MakeRustls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl MakeRustls {
    /// Trusts `tls.ca_pem` (every certificate in it) or, without one, the
    /// system's roots, and presents `tls.client_identity` when given.
    pub(crate) fn new(tls: &TlsSettings) -> Result<MakeRustls, LockError> {
        let mut config = crate::backend::rustls_config::client_config(tls, "PostgreSQL TLS")?;
        // PostgreSQL 17's direct TLS (`sslnegotiation=direct`) requires this
        // ALPN name; older servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(MakeRustls {
            config: Arc::new(config),
        })
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Self::Error> {
        // An IP address parses too, and is then matched against the
        // certificate's IP address names.
        let name = ServerName::try_from(domain.to_owned())?;
        Ok(RustlsConnect {
            config: self.config.clone(),
            name,
        })
    }
}

/// One handshake with the server named `name`.
pub(crate) struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            connector
                .connect(self.name, stream)
                .await
                .map(|s| RustlsStream(Box::new(s)))
        })
    }
}

/// A TLS session over `S`.
pub(crate) struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    /// No `tls-server-end-point` binding: SCRAM then runs without channel
    /// binding, which the default `channel_binding=prefer` accepts (and
    /// `channel_binding=require` refuses).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
