//! TLS for PostgreSQL connections: rustls, trusting the Mozilla (web PKI) roots and the CA
//! certificates of a configured PEM file beside them, and verifying the server's certificate
//! chain and host name (libpq's `verify-full`): a certificate for another host is refused.

use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::CaFileError;

/// The connector for a TLS connection trusting the web roots and, when given, every
/// certificate in `ca_file`. A file that cannot be read or holds no certificate is a
/// configuration error naming it.
pub(crate) fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, CaFileError> {
    // rustls needs a process-wide provider for `ClientConfig::builder()`; installing aws-lc-rs
    // (the one reqwest uses too) is a no-op when one is already there.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        for cert in read_certificates(path)? {
            roots.add(cert).map_err(|source| CaFileError::Unusable {
                path: path.to_path_buf(),
                source,
            })?;
        }
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The certificates of a PEM file.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let pem = std::fs::read(path).map_err(|source| CaFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CaFileError::NotPem {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(CaFileError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unusable_ca_file_is_a_configuration_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("consort-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").expect("write");
        for (path, why) in [
            (dir.join("missing.pem"), "No such file"),
            (empty.clone(), "holds no certificate"),
        ] {
            let Err(e) = connector(Some(&path)) else {
                panic!("{} accepted", path.display());
            };
            // What a person reads: the configuration error and its causes.
            let text = consort_actors::error_chain(&crate::error::Error::from(e));
            assert!(
                text.contains(&path.display().to_string()) && text.contains(why),
                "{text}"
            );
        }
        assert!(connector(None).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
