// SPDX-License-Identifier: Apache-2.0
//! TLS 1.3 with mutual certificate authentication for `tcp:` migrations:
//! the source checks that the destination's certificate is signed by the
//! CA and names the URL's host (an IP SAN for an IP address), the
//! destination accepts only a source whose certificate the CA signed.
//! Without it, anyone who reaches a listener becomes the VM and guest
//! memory crosses the network in the clear.
//!
//! rustls with the `ring` provider (aws-lc's C build is heavy) and TLS 1.3
//! only.

use std::io;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

use crate::stream::Stream;

/// How long a peer has to complete the handshake: one that connects and
/// stays silent must not hold a listener.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("Cannot read {0}")]
    Pem(PathBuf, #[source] rustls::pki_types::pem::Error),
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("No usable CA certificate in {0}")]
    Ca(PathBuf, #[source] rustls::Error),
    #[error("Invalid TLS setup (certificate, key or CA)")]
    Config(#[source] rustls::Error),
    #[error("Invalid client verifier for the CA")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
}

/// The PEM files of one end: its certificate (chain), its private key, and
/// the CA that signs the other end's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    fn certs(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| TlsError::Pem(self.cert.clone(), e))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate(self.cert.clone()));
        }
        Ok(certs)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_file(&self.key).map_err(|e| TlsError::Pem(self.key.clone(), e))
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let certs = CertificateDer::pem_file_iter(&self.ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| TlsError::Pem(self.ca.clone(), e))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate(self.ca.clone()));
        }
        let mut roots = RootCertStore::empty();
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| TlsError::Ca(self.ca.clone(), e))?;
        }
        Ok(Arc::new(roots))
    }

    /// The source's setup: presents its certificate, verifies the
    /// destination's against the CA.
    pub fn client(&self) -> Result<TlsClient, TlsError> {
        let verifier = WebPkiServerVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(TlsError::Verifier)?;
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Config)?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(self.certs()?, self.key()?)
            .map_err(TlsError::Config)?;
        Ok(TlsClient(Arc::new(config)))
    }

    /// The destination's setup: presents its certificate, requires one
    /// from the source that the CA signed.
    pub fn server(&self) -> Result<TlsServer, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(TlsError::Verifier)?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Config)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.certs()?, self.key()?)
            .map_err(TlsError::Config)?;
        Ok(TlsServer(Arc::new(config)))
    }
}

/// A source's TLS setup.
#[derive(Clone, Debug)]
pub struct TlsClient(Arc<ClientConfig>);

/// A destination's TLS setup.
#[derive(Clone, Debug)]
pub struct TlsServer(Arc<ServerConfig>);

/// The name the destination's certificate must carry: the URL's host, an
/// IP address (brackets of an IPv6 one removed) or a DNS name.
fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{host}' is no TLS server name: {e}"),
        )
    })
}

/// Runs the handshake to its end under [`HANDSHAKE_TIMEOUT`], so a refused
/// peer is told apart from a later stream error.
fn handshake<C, S>(conn: &mut C, tcp: &mut TcpStream) -> io::Result<()>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<S>>,
    S: rustls::SideData,
{
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    while conn.is_handshaking() {
        conn.complete_io(tcp)?;
    }
    // The client's last flight (its certificate) may still be queued.
    while conn.wants_write() {
        conn.write_tls(tcp)?;
    }
    Ok(())
}

impl TlsClient {
    /// TLS over `tcp`, a connection to `host`.
    pub fn connect(&self, host: &str, mut tcp: TcpStream) -> io::Result<Box<dyn Stream>> {
        let mut conn =
            ClientConnection::new(self.0.clone(), server_name(host)?).map_err(io::Error::other)?;
        handshake(&mut conn, &mut tcp)?;
        Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
    }
}

impl TlsServer {
    /// TLS over an accepted `tcp`: fails unless the peer showed a
    /// certificate signed by the CA.
    pub fn accept(&self, mut tcp: TcpStream) -> io::Result<Box<dyn Stream>> {
        let mut conn = ServerConnection::new(self.0.clone()).map_err(io::Error::other)?;
        handshake(&mut conn, &mut tcp)?;
        Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
    }
}

/// Timeouts and shutdown act on the TCP socket under the TLS session.
impl<C, S> Stream for rustls::StreamOwned<C, TcpStream>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<S>> + Send,
    S: rustls::SideData,
{
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_write_timeout(t)
    }
    fn shutdown(&self) -> io::Result<()> {
        self.sock.shutdown(std::net::Shutdown::Both)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;
    use crate::test_pki;
    use crate::transport::{AcceptError, MigrationUrl};

    /// A peer's attempt, run on its own thread.
    type Peer<'a> = Box<dyn FnOnce() + Send + 'a>;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Each bad peer is refused by the listener, which then serves a
    /// legitimate source as if nothing happened.
    #[test]
    fn bad_peers_are_refused_and_the_listener_goes_on() {
        let dir = temp_dir("peers");
        let good = test_pki::make(&dir, "good");
        let other = test_pki::make(&dir, "other");
        let listener = MigrationUrl::Tcp("127.0.0.1:0".into())
            .listen(Some(good.destination.server().unwrap()))
            .unwrap();
        let crate::transport::Listener::Tcp(tcp, _) = &listener else {
            unreachable!()
        };
        let url = MigrationUrl::Tcp(tcp.local_addr().unwrap().to_string());
        let by_name = MigrationUrl::Tcp(format!("localhost:{}", tcp.local_addr().unwrap().port()));

        // Source certificate signed by another CA.
        let stranger = TlsFiles {
            ca: good.source.ca.clone(),
            ..other.source.clone()
        };
        // Source that trusts another CA: it refuses the destination.
        let wrong_ca = TlsFiles {
            ca: other.source.ca.clone(),
            ..good.source.clone()
        };
        let source = good.source.client().unwrap();
        let bad_peers: Vec<(&str, Peer)> = vec![
            (
                "certificate of another CA",
                Box::new(|| {
                    // The client sees the refusal at its first read.
                    if let Ok(mut s) = url.connect(Some(&stranger.client().unwrap())) {
                        let _ = s.write_all(b"x");
                        let _ = s.flush();
                        assert!(s.read(&mut [0u8; 1]).is_err());
                    }
                }),
            ),
            (
                "source trusting another CA",
                Box::new(|| {
                    let e = url
                        .connect(Some(&wrong_ca.client().unwrap()))
                        .err()
                        .unwrap();
                    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
                }),
            ),
            (
                "destination's name not in its certificate",
                Box::new(|| {
                    let e = by_name.connect(Some(&source)).err().unwrap();
                    assert!(e.to_string().contains("not valid for name"), "{e}");
                }),
            ),
            (
                "plain TCP source",
                Box::new(|| {
                    let mut s = url.connect(None).unwrap();
                    let _ = crate::protocol::send_request(
                        &mut *s,
                        crate::protocol::Command::Start,
                        &crate::protocol::start_payload(),
                    );
                    assert!(crate::protocol::read_response(&mut *s).is_err());
                }),
            ),
            (
                "garbage",
                Box::new(|| {
                    let mut s = TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
                    let _ = s.write_all(&[0x16; 4096]);
                    let _ = s.read(&mut [0u8; 64]);
                }),
            ),
        ];
        std::thread::scope(|scope| {
            for (what, peer) in bad_peers {
                let client = scope.spawn(peer);
                match listener.accept() {
                    Err(AcceptError::Peer(..)) => {}
                    Err(e) => panic!("{what}: listener failed: {e}"),
                    Ok(_) => panic!("{what}: accepted"),
                }
                client.join().unwrap();
            }
            let client = scope.spawn(|| {
                let mut s = url.connect(Some(&source)).unwrap();
                s.write_all(b"hello").unwrap();
                s.flush().unwrap();
                let mut buf = [0u8; 2];
                s.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"ok");
            });
            let mut s = listener.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"hello");
            s.write_all(b"ok").unwrap();
            s.flush().unwrap();
            client.join().unwrap();
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A peer that connects and stays silent is dropped after the
    /// handshake timeout instead of holding the listener.
    #[test]
    fn silent_peer_times_out() {
        let dir = temp_dir("silent");
        let pki = test_pki::make(&dir, "pki");
        let listener = MigrationUrl::Tcp("127.0.0.1:0".into())
            .listen(Some(pki.destination.server().unwrap()))
            .unwrap();
        let crate::transport::Listener::Tcp(tcp, _) = &listener else {
            unreachable!()
        };
        let _silent = TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
        let t0 = std::time::Instant::now();
        assert!(matches!(listener.accept(), Err(AcceptError::Peer(..))));
        assert!(t0.elapsed() >= HANDSHAKE_TIMEOUT - Duration::from_secs(1));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn setup_errors_name_the_file() {
        let dir = temp_dir("files");
        let pki = test_pki::make(&dir, "pki");
        let missing = TlsFiles {
            key: dir.join("nope.pem"),
            ..pki.source.clone()
        };
        let e = missing.client().err().unwrap().to_string();
        assert!(e.contains("nope.pem"), "{e}");
        // A certificate file given as the key.
        let swapped = TlsFiles {
            key: pki.source.cert.clone(),
            ..pki.source.clone()
        };
        assert!(swapped.server().is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
