//! Test certificates, keys and CRLs, made with the `openssl` command in a test's directory: the one
//! copy that rein-runtime's unit tests (crates/rein-runtime/src/tls.rs) and rein's integration tests
//! (crates/rein/tests, as `common::tls`) both use. Before, each had its own (a `Pki` type in the unit
//! tests, these functions in the integration tests), doing the same `openssl req`/`x509`/`ca` calls.
//!
//! Why in this crate: the two users are in two crates, and rein-runtime's unit tests cannot reach rein's
//! test files (rein depends on rein-runtime, not the reverse). A module of rein-runtime behind a feature
//! that rein's tests turned on would do, but Cargo unifies a dev-dependency's features with the normal
//! dependency's for the targets built together, so the `rein` binary that rein's tests run would carry
//! it. rein-testkit is a dev-dependency only and depends on no crate of the workspace.
//!
//! Names: the CA `ca` is `<ca>-cert.pem` and `<ca>-key.pem`; a certificate `name` is `<name>-cert.pem`
//! and `<name>-key.pem`; keys are P-256; everything is valid for 2 days unless said otherwise. A CA's
//! database for revocation (`<ca>.cnf`, `<ca>-index.txt`, `<ca>-crlnumber`) is written on first use.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `openssl` command, which must be installed.
fn openssl_command() -> Command {
    let installed = Command::new("sh").args(["-c", "command -v openssl"]).output().is_ok_and(|o| o.status.success());
    assert!(installed, "openssl is not installed (scripts/test.sh installs it)");
    Command::new("openssl")
}

/// Runs `openssl args` in `dir`; it must succeed.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = openssl_command().current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

const EC: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];

/// A self-signed CA (`<ca>-cert.pem`, `<ca>-key.pem`) in `dir`, common name `cn`, valid for 2 days.
pub fn make_ca(dir: &Path, ca: &str, cn: &str) {
    let (key, cert, subj) = (format!("{ca}-key.pem"), format!("{ca}-cert.pem"), format!("/CN={cn}"));
    let rest = ["-keyout", &key, "-out", &cert, "-subj", &subj, "-days", "2"];
    openssl(dir, &[&["req", "-x509"][..], &EC, &rest].concat());
}

/// The extensions of a client certificate.
pub const CLIENT: &str = "extendedKeyUsage=clientAuth\n";

/// The extensions of an intermediate CA: a certificate [`make_cert`] makes with them signs others.
pub const CA: &str = "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n";

/// The extensions of a server certificate for `alt_names` (`IP:127.0.0.1,DNS:localhost`).
pub fn server(alt_names: &str) -> String {
    format!("subjectAltName={alt_names}\nextendedKeyUsage=serverAuth\n")
}

/// A certificate `<name>-cert.pem` with key `<name>-key.pem`, common name `cn` and `extensions`
/// ([`CLIENT`], [`server`], [`CA`]), signed by the CA `ca` (see [`make_ca`]), valid for 2 days.
pub fn make_cert(dir: &Path, ca: &str, name: &str, cn: &str, extensions: &str) {
    make_cert_for(dir, ca, name, cn, extensions, 2);
}

/// [`make_cert`] valid for `days` days.
pub fn make_cert_for(dir: &Path, ca: &str, name: &str, cn: &str, extensions: &str, days: u32) {
    let (key, csr, cert, ext) =
        (format!("{name}-key.pem"), format!("{name}.csr"), format!("{name}-cert.pem"), format!("{name}.ext"));
    std::fs::write(dir.join(&ext), extensions).unwrap();
    let subj = format!("/CN={cn}");
    openssl(dir, &[&["req"][..], &EC, &["-keyout", &key, "-out", &csr, "-subj", &subj]].concat());
    let (ca_cert, ca_key) = (format!("{ca}-cert.pem"), format!("{ca}-key.pem"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_cert,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            &days.to_string(),
            "-extfile",
            &ext,
        ],
    );
}

/// When the certificate in `dir/file` expires (its notAfter), in seconds since the Unix epoch.
pub fn not_after(dir: &Path, file: &str) -> i64 {
    let out = openssl_command().current_dir(dir).args(["x509", "-noout", "-enddate", "-in", file]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let date = text.trim().trim_start_matches("notAfter=");
    let out = Command::new("date").args(["-u", "-d", date, "+%s"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|e| panic!("notAfter {date:?}: {e}"))
}

/// A libnbd / qemu certificate directory `dir/name`: `ca-cert.pem` and, if `client` names a certificate,
/// `client-cert.pem` and `client-key.pem`.
pub fn cert_dir(dir: &Path, name: &str, ca: &str, client: Option<&str>) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(dir.join(format!("{ca}-cert.pem")), d.join("ca-cert.pem")).unwrap();
    if let Some(c) = client {
        std::fs::copy(dir.join(format!("{c}-cert.pem")), d.join("client-cert.pem")).unwrap();
        std::fs::copy(dir.join(format!("{c}-key.pem")), d.join("client-key.pem")).unwrap();
    }
    d
}

/// Writes `<ca>.cnf` and the database `openssl ca` keeps for the CA `ca` in `dir` (once), so that it can
/// revoke certificates and issue CRLs; returns the config's name.
fn ca_database(dir: &Path, ca: &str) -> String {
    let cnf = format!("{ca}.cnf");
    if !dir.join(&cnf).exists() {
        std::fs::write(dir.join(format!("{ca}-index.txt")), "").unwrap();
        std::fs::write(dir.join(format!("{ca}-crlnumber")), "01\n").unwrap();
        let text = format!(
            "[ca]\ndefault_ca = d\n[d]\ndatabase = {ca}-index.txt\ncrlnumber = {ca}-crlnumber\n\
             certificate = {ca}-cert.pem\nprivate_key = {ca}-key.pem\ndefault_md = sha256\ndefault_crl_days = 2\n"
        );
        std::fs::write(dir.join(&cnf), text).unwrap();
    }
    cnf
}

/// Writes the CA `ca`'s CRL (PEM) to `dir/out`: the certificates [`revoke`] revoked so far, or none.
pub fn make_crl(dir: &Path, ca: &str, out: &str) {
    let cnf = ca_database(dir, ca);
    openssl(dir, &["ca", "-config", &cnf, "-gencrl", "-out", out]);
}

/// Revokes the certificate `<name>-cert.pem`, issued by the CA `ca`, in that CA's database (the next
/// [`make_crl`] lists it).
pub fn revoke(dir: &Path, ca: &str, name: &str) {
    let cnf = ca_database(dir, ca);
    openssl(dir, &["ca", "-config", &cnf, "-revoke", &format!("{name}-cert.pem")]);
}
