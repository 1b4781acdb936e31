// SPDX-License-Identifier: Apache-2.0
//! Certificates made on the fly for tests: a CA, a destination certificate
//! for 127.0.0.1 and a source certificate, both signed by it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

use crate::tls::TlsFiles;

/// Both ends' files of one CA.
pub struct Pki {
    pub destination: TlsFiles,
    pub source: TlsFiles,
}

/// Writes `{name}-ca.pem` and the two ends' certificates and keys into
/// `dir`; the destination's names `127.0.0.1`.
pub fn make(dir: &Path, name: &str) -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name} test CA"));
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let ca_path = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let end = |who: &str, sans: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{name}-{who}.pem")),
            key: dir.join(format!("{name}-{who}-key.pem")),
            ca: ca_path.clone(),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    };
    Pki {
        destination: end("destination", vec!["127.0.0.1".into()]),
        source: end("source", vec!["source.test".into()]),
    }
}
