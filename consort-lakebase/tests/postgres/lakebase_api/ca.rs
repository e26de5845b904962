//! A certificate authority made for one test with the `openssl` program: a CA certificate and
//! a server certificate (and key) it signed for one host name.

use std::path::{Path, PathBuf};
use std::process::Command;

use consort_testkit::process::succeeded;

/// The files of a test CA, removed with it.
pub(crate) struct TestCa {
    /// The CA certificate (PEM): what a client trusts.
    pub ca: PathBuf,
    /// The server certificate (PEM), for `host` only.
    pub cert: PathBuf,
    /// The server's private key (PEM).
    pub key: PathBuf,
    _dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str], what: &str) {
    succeeded(Command::new("openssl").args(args).current_dir(dir), what);
}

impl TestCa {
    /// A new CA and a server certificate for `host` (a DNS name).
    pub(crate) fn for_host(host: &str) -> TestCa {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca_args = vec!["req", "-x509"];
        ca_args.extend(ec);
        ca_args.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Consort test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(d, &ca_args, "make the CA");
        let subject = format!("/CN={host}");
        let mut csr_args = vec!["req"];
        csr_args.extend(ec);
        csr_args.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            &subject,
        ]);
        openssl(d, &csr_args, "make the server's key and request");
        std::fs::write(
            d.join("server.ext"),
            format!(
                "subjectAltName=DNS:{host}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .expect("write the extensions");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
            "sign the server's certificate",
        );
        TestCa {
            ca: d.join("ca.pem"),
            cert: d.join("server.pem"),
            key: d.join("server.key"),
            _dir: dir,
        }
    }
}
