//! TLS for NBD (`[tls]` in rein.toml): the server's OpenSSL context, built and checked once from the
//! config, and the TLS handshake a connection runs after NBD_OPT_STARTTLS.
//!
//! The protocol side (when STARTTLS is offered, acknowledged or required) is rein-proto's
//! [`ServerHandshake`](rein_proto::nbd::ServerHandshake); this module only turns a socket into a TLS
//! stream and says who the client is.
//!
//! # Credentials
//! - **x509**: `cert` (PEM, the server's certificate followed by any intermediates) and `key` (PEM).
//!   With `ca` (PEM, one or more certificates) every client must present a certificate that chains to
//!   one of them (the handshake fails otherwise); without it no client certificate is asked for.
//! - **Revocation** (`crl`, with `ca`): PEM CRLs (`openssl ca -gencrl`; qemu-nbd and nbdkit read the same
//!   file as `ca-crl.pem`), each of which must be signed by a CA of `ca` (checked at load: a CRL no
//!   configured CA signed could revoke anyone). A client whose chain OpenSSL's check accepts is then
//!   refused if a CRL lists any certificate of that verified chain (its own, or an intermediate CA's: a
//!   CRL of the certificate's issuer lists its serial number), as `openssl verify -crl_check_all`
//!   refuses it; the server logs that it is revoked. (Only the client's own certificate was looked up
//!   before, so the clients of an intermediate CA that the root's CRL lists were admitted.)
//!   The lists are used whatever their nextUpdate says (a CA with no CRL revokes no one; Rein does not
//!   ask OpenSSL for its CRL check, which refuses every client of a CA without a current CRL). A reload
//!   takes a new CRL written over the file ("Reload"). A client's table (`[node_tls]`, `[pshift.tls]`,
//!   `rein load --tls-crl`) takes a `crl` the same way, for the server's certificate: checked the same
//!   way, after OpenSSL's chain and name checks.
//! - **PSK** (`psk_file`): `identity:hexkey` per line, the format of GnuTLS's `psktool` that nbdkit,
//!   qemu-nbd and libnbd read. Keys of 1..=[`MAX_PSK_BYTES`] bytes, identities of 1..=[`MAX_IDENTITY_BYTES`]
//!   bytes, at most [`MAX_PSK_IDENTITIES`] lines; blank lines are skipped. A PSK client needs no
//!   certificate, also when `ca` is set.
//!
//! # Secret files
//! A private key (`key`) and a PSK file (`psk_file`, and a PARDA host's `key_file`, read here too) that
//! every local user may read or write (the mode's "other" bits) are warned of when read, at start and at
//! each reload, naming the setting, the file and its mode (`tls.key FILE is readable by every user (mode
//! 644): chmod 600`); `--check-config` prints the `[tls]` table's. They are read all the same, unlike
//! the admin token (refused at such a mode): a key refused where it was taken yesterday would stop a
//! node at its next restart for a fix `chmod` makes, and a warning in every log says it. Certificates,
//! CAs and CRLs are public and not looked at.
//!
//! # Protocol versions and suites
//! TLS 1.2 and 1.3 (Mozilla's "intermediate" profile, OpenSSL's defaults otherwise). For PSK, TLS 1.3
//! through OpenSSL's PSK callback: the key it returns is bound to SHA-256, so the server must choose a
//! SHA-256 suite. GnuTLS clients list TLS_AES_256_GCM_SHA384 first; with the client's order OpenSSL chose
//! it, dropped the PSK as incompatible and sent a certificate, and the clients failed with "Insufficient
//! credentials". The TLS 1.3 suites are therefore ordered SHA-256 first (`SUITES_1_3`) and the
//! server's order wins (`CIPHER_SERVER_PREFERENCE`); GnuTLS clients
//! (libnbd's nbdinfo and nbdcopy, qemu-img) then agree on TLS_AES_128_GCM_SHA256 with the PSK (and
//! ECDHE). For TLS 1.2 PSK clients the cipher list adds the (EC)DHE-PSK and PSK AEAD suites (checked by
//! hand with a server capped at TLS 1.2).
//!
//! A PSK identity counts only if its key was used (`psk_identity`): OpenSSL looks a TLS 1.3 client's
//! offered identity up (the callback records it) before it checks the suite, and with a suite whose hash
//! is not SHA-256 it drops the PSK and goes on with a certificate handshake. A client that knew only an
//! identity's name, offering it with any key and TLS_AES_256_GCM_SHA384 alone, was taken for it (its
//! exports opened, `allow_identities` passed) on a server with both `cert` and `psk_file`.
//!
//! # Reload
//! A reload (SIGHUP) builds the contexts again from the files as they are then, so certificates renewed
//! in place (the same file names, new contents) and changed `[tls]` tables are taken without a restart.
//! A server's context is held in a [`LiveTls`], which the reload replaces: each TLS handshake takes the
//! one current when the handshake starts (NBD's STARTTLS, the admin endpoint's first byte, the pShift
//! controller's accept), so handshakes from then on use the new one, and connections already open keep
//! the session they negotiated, as with nginx or HAProxy, unless the new context revokes their client:
//! a certificate of its chain its `crl` lists, a PSK identity its `psk_file` no longer has. Those are
//! cut at the reload (their sockets shut down, [`LiveTls::set`]): an NBD connection lives as long as
//! its VM, and a revocation that waited for it to end would not revoke.
//!
//! An NBD STARTTLS is answered under the context current when the option is read (rein-proto's
//! `ServerHandshake::set_tls` before each read), and an acknowledged one runs its TLS handshake under
//! that same context. A reload that turned TLS off (no `[tls]`, or `mode = "off"`) before a client's
//! STARTTLS has it refused with NBD_REP_ERR_POLICY, and the handshake goes on in plain, as with a
//! server without TLS: a client with optional TLS carries on, one that requires it gives up with its own
//! error. (Before, the STARTTLS was acknowledged under the mode of the connection's start, and the
//! server then dropped the connection for want of a context; with `mode = "off"` and the table kept,
//! it went on with TLS.)
//!
//! A handshake under way during the reload is not in the list the reload sweeps, and ran under the old
//! context; so once done, a connection registers ([`LiveTls::register`]) by checking its client against
//! the context current then, under the list's lock, which the reload holds from its replacement of the
//! context to the end of its sweep. Either the registration comes first and the sweep cuts it, or the
//! replacement does and the registration is refused (logged as a cut, the connection closed): no
//! order lets a revoked client through. Before, the context was taken when the TCP connection came in
//! and the registration checked nothing: a client holding its connection before STARTTLS across a
//! revoking reload completed its handshake with the old context and was served until the next reload. A client's context (a gateway's `[node_tls]`, rein serve's `[pshift.tls]`) is
//! held in a [`LiveTlsClient`] likewise: the connections opened from then on (to a node, to the pShift
//! controller) use it, and once the reload completes the links open to a server whose certificate its
//! `crl` lists (it or a CA above it) are cut ([`LiveTlsClient::cut_revoked`]; they reconnect with the
//! new context, which refuses that server), and a link whose handshake completes after the reload
//! registers against the new context as a server's connection does ([`LiveTlsClient::register`]). [`TlsConfig::change`] and [`TlsClient::changed`] say what a reload changed, for
//! its log line; credentials count as changed when a file's path or bytes differ (each context keeps a
//! digest of them). The pShift controller reloads its `[tls]` the same way, cutting the server
//! connections it revokes.
//!
//! # Identity
//! What access control matches (`allow_identities`): the PSK identity as written in `psk_file` (e.g.
//! `alice`), or the common name (CN) of a verified client certificate (e.g. `client.example.com`). A
//! client with neither has no identity.

use openssl::ex_data::Index;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::ssl::{Ssl, SslAcceptor, SslConnector, SslContextBuilder, SslMethod, SslOptions, SslRef, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use rein_proto::nbd::TlsMode;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_openssl::SslStream;

/// Longest PSK key, in bytes (OpenSSL's `PSK_MAX_PSK_LEN`).
pub const MAX_PSK_BYTES: usize = 512;
/// Longest PSK identity, in bytes (OpenSSL's `PSK_MAX_IDENTITY_LEN`).
pub const MAX_IDENTITY_BYTES: usize = 128;
/// Most identities in a `psk_file`.
pub const MAX_PSK_IDENTITIES: usize = 65_536;
/// A certificate closer than this to its expiry is warned of at start and at each reload (days; the
/// alerting rule `ReinTlsCertificateExpiresSoon` uses the same).
pub const EXPIRY_WARNING_DAYS: i64 = 14;

/// `secs` (at least 0) in the largest whole unit that keeps two of them: `3 days`, `47 hours`, `5 minutes`.
fn span(secs: i64) -> String {
    let (n, unit) = match secs {
        s if s >= 2 * 86_400 => (s / 86_400, "day"),
        s if s >= 2 * 3_600 => (s / 3_600, "hour"),
        s if s >= 2 * 60 => (s / 60, "minute"),
        s => (s, "second"),
    };
    rein_core::Count(n as usize, unit).to_string()
}

/// The wall clock in seconds since the Unix epoch, for certificate expiry.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Largest certificate, key, CA or PSK file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The cipher list for TLS 1.2: OpenSSL's defaults plus the PSK suites GnuTLS clients offer.
const CIPHERS_1_2: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:\
ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:\
DHE-RSA-AES256-GCM-SHA384:ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES128-CBC-SHA256:DHE-PSK-AES128-GCM-SHA256:\
DHE-PSK-AES256-GCM-SHA384:DHE-PSK-CHACHA20-POLY1305:PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-CHACHA20-POLY1305";

/// The TLS 1.3 suites, in the server's order of preference: those with SHA-256 first (module comment).
const SUITES_1_3: &str = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384";

/// The `[tls]` table, validated: the mode, where the credentials came from, and the OpenSSL context
/// built from them (so a bad file stops the server at start, naming the key and the file).
#[derive(Clone)]
pub struct TlsConfig {
    /// Off, offered, or required.
    pub mode: TlsMode,
    /// `cert`, resolved.
    pub cert: Option<PathBuf>,
    /// `ca`, resolved: client certificates are required and verified against it.
    pub ca: Option<PathBuf>,
    /// `psk_file`, resolved, and how many identities it holds.
    pub psk: Option<(PathBuf, usize)>,
    /// A digest of the credential files' paths and bytes ([`digest`]): a reload that finds other bytes
    /// under the same names says so ([`TlsConfig::change`]).
    digest: u64,
    /// When `cert` expires (seconds since the Unix epoch), for `/metrics` ([`Presented`]).
    pub not_after: Option<i64>,
    /// `crl`'s lists, for the open connections a reload cuts ([`LiveTls::set`]).
    crls: Arc<Vec<openssl::x509::X509Crl>>,
    /// `psk_file`'s identities, likewise.
    psk_identities: Option<Arc<std::collections::HashSet<String>>>,
    /// The warnings for `key` and `psk_file` if every user may read them ([`exposed`]), for
    /// `--check-config` ([`TlsConfig::describe`]).
    exposed: Vec<String>,
    acceptor: Arc<SslAcceptor>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .field("cert", &self.cert)
            .field("ca", &self.ca)
            .field("psk", &self.psk)
            .finish_non_exhaustive()
    }
}

/// The `[tls]` table's file names, resolved against the config file's directory.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// `cert`.
    pub cert: Option<PathBuf>,
    /// `key`.
    pub key: Option<PathBuf>,
    /// `ca`.
    pub ca: Option<PathBuf>,
    /// `psk_file`.
    pub psk_file: Option<PathBuf>,
    /// `crl`: revoked client certificates (PEM CRLs, each signed by a CA of `ca`).
    pub crl: Option<PathBuf>,
}

/// Why TLS credentials (a server's `[tls]`, a client's table such as `[node_tls]`, or the command line's
/// `--tls-*` flags) were refused: the setting as the caller names it, the file, and what is wrong. Each
/// message names the setting once.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// A credential file (named by its setting, `key`) cannot be read, parsed or used.
    #[error("{key} {}: {problem}", path.display())]
    File {
        /// The setting that names it (`tls.cert`, `node_tls.ca`, `--tls-ca`).
        key: String,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: FileProblem,
    },
    /// A line of a PSK file is refused.
    #[error("{key} {} line {line}: {problem}", path.display())]
    PskLine {
        /// The setting that names the file.
        key: String,
        /// The file.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with the line.
        problem: PskLineProblem,
    },
    /// A private key that does not match the certificate it is given with.
    #[error("{key_setting} {} does not match the certificate in {cert_setting} {}", key.display(), cert.display())]
    KeyMismatch {
        /// The key's setting (`tls.key`).
        key_setting: String,
        /// The key's file.
        key: PathBuf,
        /// The certificate's setting (`tls.cert`).
        cert_setting: String,
        /// The certificate's file.
        cert: PathBuf,
    },
    /// The PSK identity asked for is not in the file.
    #[error("{identity_setting} {identity:?} is not in {file_setting} {}", path.display())]
    UnknownPskIdentity {
        /// The setting that names the identity (`node_tls.psk_identity`).
        identity_setting: String,
        /// The identity asked for.
        identity: String,
        /// The setting that names the file.
        file_setting: String,
        /// The file.
        path: PathBuf,
    },
    /// A PSK file of several identities, and none named.
    #[error("{file_setting} {} has {identities} identities: name one with {identity_setting}", path.display())]
    PskIdentityNeeded {
        /// The setting that names the file.
        file_setting: String,
        /// The file.
        path: PathBuf,
        /// How many identities it holds.
        identities: usize,
        /// The setting that would name one.
        identity_setting: String,
    },
    /// A setting given without the one it goes with (`tls.cert needs tls.key`).
    #[error("{setting} needs {needs}")]
    Needs {
        /// The setting given.
        setting: String,
        /// The setting it needs.
        needs: String,
    },
    /// OpenSSL refused a step of setting the context up.
    #[error("{group}: {step}{error}")]
    Context {
        /// The settings' group (`tls`, `node_tls`, `--tls-*`).
        group: String,
        /// The step, as the message says it (`cipher list: `; empty for the certificate store).
        step: &'static str,
        /// OpenSSL's errors.
        error: openssl::error::ErrorStack,
    },
    /// A server's `[tls]` on or required with no credentials.
    #[error("tls.mode = \"on\" or \"require\" needs tls.cert and tls.key, or tls.psk_file")]
    NoServerCredentials,
    /// A server's `crl` without `ca`.
    #[error("tls.crl needs tls.ca: it revokes client certificates, which only tls.ca asks for")]
    ServerCrlWithoutCa,
    /// A client's `crl` without `ca` (with `psk_file`).
    #[error("{} needs {}: it revokes server certificates, which only {} checks", names.key("crl"), names.key("ca"), names.key("ca"))]
    ClientCrlWithoutCa {
        /// How the settings are named.
        names: Naming,
    },
    /// A client's `cert` or `key` with `psk_file`.
    #[error(
        "{} and {} go with {} (x509), not with {}",
        names.key("cert"), names.key("key"), names.key("ca"), names.key("psk_file")
    )]
    ClientCertWithPsk {
        /// How the settings are named.
        names: Naming,
    },
    /// A client's `ca` and `psk_file` both.
    #[error("{}: give {} (x509) or {} (PSK), not both", names.group(), names.key("ca"), names.key("psk_file"))]
    ClientCaAndPsk {
        /// How the settings are named.
        names: Naming,
    },
    /// A client's table with neither `ca` nor `psk_file`.
    #[error(
        "{} needs {} (x509: the CA of the servers' certificates) or {}",
        names.group(), names.key("ca"), names.key("psk_file")
    )]
    ClientNoCredentials {
        /// How the settings are named.
        names: Naming,
    },
}

/// What is wrong with a credential file ([`CredentialError::File`] names the setting and the file).
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// It cannot be opened or read.
    #[error("{0}")]
    Io(std::io::Error),
    /// It is longer than `max` bytes.
    #[error("larger than {max} bytes")]
    TooLarge {
        /// The longest file read ([`MAX_FILE_BYTES`]).
        max: u64,
    },
    /// It is not UTF-8 text (a PSK file).
    #[error("not UTF-8 text")]
    NotUtf8,
    /// It is not PEM text (a CRL file).
    #[error("not PEM text")]
    NotPemText,
    /// It does not parse as PEM certificates.
    #[error("not a PEM certificate: {0}")]
    NotPemCertificate(openssl::error::ErrorStack),
    /// It holds no certificate.
    #[error("no certificate in it")]
    NoCertificate,
    /// It does not parse as a PEM private key.
    #[error("not a PEM private key: {0}")]
    NotPemKey(openssl::error::ErrorStack),
    /// OpenSSL refused what it holds (a certificate of a chain, a CA, a key).
    #[error("{0}")]
    Refused(openssl::error::ErrorStack),
    /// A CRL's BEGIN line without its END line.
    #[error("a CRL without its -----END X509 CRL----- line")]
    UnterminatedCrl,
    /// A CRL block that does not parse.
    #[error("not a PEM CRL: {0}")]
    NotPemCrl(openssl::error::ErrorStack),
    /// A CRL that no CA of the `ca` file signed.
    #[error(
        "the CRL of {issuer} is not signed by a CA of {ca_setting} {} (a CRL no configured CA signed could revoke \
         anyone)",
        ca.display()
    )]
    CrlNotSigned {
        /// The CRL's issuer.
        issuer: String,
        /// The `ca` setting.
        ca_setting: String,
        /// The `ca` file.
        ca: PathBuf,
    },
    /// No CRL in a CRL file.
    #[error("no CRL in it (a -----BEGIN X509 CRL----- block)")]
    NoCrl,
    /// No identity in a PSK file.
    #[error("no identity in it")]
    NoPskIdentity,
}

/// What is wrong with a line of a PSK file ([`CredentialError::PskLine`] names the file and the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskLineProblem {
    /// No `:`.
    #[error("expected identity:hexkey")]
    Syntax,
    /// An identity empty or longer than `max` bytes.
    #[error("the identity must have 1..={max} bytes")]
    IdentityLength {
        /// The longest identity ([`MAX_IDENTITY_BYTES`]).
        max: usize,
    },
    /// A key that is not hexadecimal digits.
    #[error("the key is not hexadecimal")]
    NotHex,
    /// A key empty or longer than `max` bytes.
    #[error("the key must have 1..={max} bytes")]
    KeyLength {
        /// The longest key ([`MAX_PSK_BYTES`]).
        max: usize,
    },
    /// An identity of an earlier line.
    #[error("identity {identity:?} is repeated")]
    Repeated {
        /// The identity.
        identity: String,
    },
    /// More than `max` identities in the file.
    #[error("more than {max} identities")]
    TooMany {
        /// The most identities a file may hold ([`MAX_PSK_IDENTITIES`]).
        max: usize,
    },
}

impl CredentialError {
    /// A [`CredentialError::File`] for the file `path` named by `key`.
    fn file(key: &str, path: &Path, problem: FileProblem) -> CredentialError {
        CredentialError::File { key: key.to_string(), path: path.to_path_buf(), problem }
    }
}

/// Reads a credential file named by the key `key` (`tls.cert`, `node_tls.ca`, ...), at most
/// [`MAX_FILE_BYTES`]; errors name the key and the file.
fn read(key: &str, path: &Path) -> Result<Vec<u8>, CredentialError> {
    use std::io::Read;
    let io = |e| CredentialError::file(key, path, FileProblem::Io(e));
    // Not waiting for a FIFO's writer: one nobody writes to reads as empty (its PEM or key lines then
    // refused), where a blocking open held a start, a reload or `rein load` for ever.
    let file = crate::durable::open_to_read(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(CredentialError::file(key, path, FileProblem::TooLarge { max: MAX_FILE_BYTES }));
    }
    Ok(bytes)
}

/// [`read`] for a secret (a private key, a PSK file), warning once per read (so once per load: at start,
/// at each reload) if every local user may read or write it ([`exposed`]); the file is read all the same
/// (module comment, "Secret files").
fn read_secret(key: &str, path: &Path) -> Result<Vec<u8>, CredentialError> {
    let bytes = read(key, path)?;
    if let Some(w) = exposed(key, path) {
        tracing::warn!("{w}");
    }
    Ok(bytes)
}

/// The warning for a secret file named by the key `key` that every local user may read or write (any of
/// its mode's "other" bits), or `None` (a group may read it: an operators' group, as for the admin
/// token).
pub fn exposed(key: &str, path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    let how = match (mode & 0o004 != 0, mode & 0o002 != 0) {
        (false, false) => return None,
        (true, false) => "readable",
        (false, true) => "writable",
        (true, true) => "readable and writable",
    };
    Some(format!("{key} {} is {how} by every user (mode {mode:o}): chmod 600", path.display()))
}

/// A digest of the credential files `paths` (each path and its bytes as they are now, or the reason it
/// cannot be read), so a reload can tell new credentials under the same file names. A file that changes
/// between this read and the context's build is at worst reported once more than it changed: the
/// context is built anew at every reload whatever the digest says.
fn digest(paths: &[&Option<PathBuf>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in paths {
        p.hash(&mut h);
        if let Some(p) = p {
            match read("", p) {
                Ok(bytes) => bytes.hash(&mut h),
                Err(e) => e.to_string().hash(&mut h),
            }
        }
    }
    h.finish()
}

/// A server's TLS context that a reload replaces (module comment, "Reload"): clones share it. What it
/// holds is `C`: by default `Option<TlsConfig>`, `None` being TLS off (NBD's `[tls]`, the pShift
/// controller's), or a `TlsConfig` that is always there ([`AdminTls`]). It also knows the TLS
/// connections open under it that a reload could revoke ([`LiveTls::register`]): [`LiveTls::set`] cuts
/// those whose credential the new context revokes.
#[derive(Clone, Default)]
pub struct LiveTls<C: HeldContext = Option<TlsConfig>> {
    tls: Arc<RwLock<C>>,
    open: Arc<std::sync::Mutex<OpenTls>>,
}

/// The admin endpoint's context under `admin_tls`: a [`LiveTls`] that always holds one, so its
/// handshake has no "TLS turned off" case to handle. A reload cannot take it away: one that keeps
/// `admin_tls = true` without `[tls]`'s certificate is refused whole (`admin_tls = true needs tls.cert
/// and tls.key`), and one that turns `admin_tls` off (with or without `[tls]`) is reported as needing a
/// restart and keeps the running context (crate::live's reload), which it sets again.
pub type AdminTls = LiveTls<TlsConfig>;

/// What a [`LiveTls`] holds: `Option<TlsConfig>`, or a `TlsConfig` that cannot be absent.
pub trait HeldContext: Clone {
    /// The context, if there is one.
    fn context(&self) -> Option<&TlsConfig>;
}

impl HeldContext for Option<TlsConfig> {
    fn context(&self) -> Option<&TlsConfig> {
        self.as_ref()
    }
}

impl HeldContext for TlsConfig {
    fn context(&self) -> Option<&TlsConfig> {
        Some(self)
    }
}

/// The TLS connections open under a [`LiveTls`], by number.
#[derive(Default)]
struct OpenTls {
    next: u64,
    conns: HashMap<u64, OpenConn>,
}

/// One open TLS connection: who its client is, where from, and a duplicate of its socket to cut it by.
struct OpenConn {
    who: Credential,
    peer: String,
    socket: std::os::fd::OwnedFd,
}

/// What a TLS peer presented, as revocation asks ([`LiveTls::set`], [`LiveTls::register`]).
#[derive(Clone)]
pub enum Credential {
    /// A verified certificate chain, the peer's own certificate first and then the CAs above it as
    /// OpenSSL verified them: a CRL revokes the whole chain's clients if it lists any of them.
    Cert(Vec<X509>),
    /// A PSK identity.
    Psk(String),
}

impl Credential {
    /// What the peer of an established session presented, if anything a reload could revoke: its PSK
    /// identity, or its verified certificate chain (its certificate alone if OpenSSL kept no chain).
    pub fn of(ssl: &SslRef) -> Option<Credential> {
        if let Some(id) = psk_identity(ssl) {
            return Some(Credential::Psk(id.clone()));
        }
        let chain: Vec<X509> =
            ssl.verified_chain().map(|c| c.iter().map(|x| x.to_owned()).collect()).unwrap_or_default();
        if !chain.is_empty() {
            return Some(Credential::Cert(chain));
        }
        ssl.peer_certificate().map(|c| Credential::Cert(vec![c]))
    }
}

/// The PSK identity an accepted session was authenticated with, if one was (module comment): the
/// identity the callback looked up, trusted only when its key was used. TLS 1.3 takes the callback's key
/// as a session to resume, so a session keyed by it is a resumed one; TLS 1.2 calls the callback only
/// in a PSK suite's key exchange. An identity looked up and then dropped (a TLS 1.3 suite whose hash is
/// not SHA-256) was claimed, not proven.
fn psk_identity(ssl: &SslRef) -> Option<&String> {
    let id = ssl.ex_data(psk_identity_index())?;
    let tls13 = ssl.version2() == Some(openssl::ssl::SslVersion::TLS1_3);
    (!tls13 || ssl.session_reused()).then_some(id)
}

/// A connection's place in its [`LiveTls`]'s list: removed when dropped (the connection ended).
pub struct Registration {
    open: Arc<std::sync::Mutex<OpenTls>>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).conns.remove(&self.id);
    }
}

impl<C: HeldContext> LiveTls<C> {
    /// Holds `tls`.
    pub fn new(tls: C) -> LiveTls<C> {
        LiveTls { tls: Arc::new(RwLock::new(tls)), open: Arc::default() }
    }

    /// The context now: a handshake takes it once, when it starts (module comment, "Reload").
    pub fn get(&self) -> C {
        self.tls.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// When the certificate now held expires (seconds since the Unix epoch), for `/metrics`.
    fn not_after(&self) -> Option<i64> {
        self.tls.read().unwrap_or_else(|e| e.into_inner()).context().and_then(|t| t.not_after)
    }

    /// Replaces the context for the handshakes from now on, and cuts the open connections whose client
    /// it revokes (a certificate its `crl` lists, or one above it; a PSK identity its `psk_file` no
    /// longer has): their sockets are shut down, so their reads end and their requests in flight get no
    /// reply. Returns one line per connection cut (the peer and why), each also logged.
    ///
    /// The list's lock is held from the replacement to the end of the sweep, and
    /// [`LiveTls::register`] checks under it: a connection is either listed before the replacement
    /// (and swept) or checked against the new context (and refused), whichever context its handshake
    /// ran under.
    pub fn set(&self, tls: C) -> Vec<String> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        *self.tls.write().unwrap_or_else(|e| e.into_inner()) = tls.clone();
        let Some(tls) = tls.context() else { return Vec::new() };
        let mut cut = Vec::new();
        for c in open.conns.values() {
            if let Some(why) = tls.revokes(&c.who) {
                let _ = socket2::SockRef::from(&c.socket).shutdown(std::net::Shutdown::Both);
                tracing::warn!(peer = %c.peer, "closing a TLS connection: {why}");
                cut.push(format!("{}: {why}", c.peer));
            }
        }
        cut
    }

    /// Lists an open connection from `peer` whose client presented what `ssl`'s accepted session shows
    /// ([`Credential::of`]), with a duplicate of its socket (`socket`) for [`LiveTls::set`] to cut it by;
    /// it stays listed while the registration lives. `Ok(None)` when the client presented nothing a
    /// reload could revoke.
    ///
    /// The handshake may have run under a context a reload has since replaced (it takes the context when
    /// it starts, and may take seconds): the credential is checked against the context now, under the
    /// lock [`LiveTls::set`] sweeps under, so a reload between the handshake's start and this call is
    /// never missed. `Err(why)` (also logged, as the sweep logs a cut) when that context revokes the
    /// client: the caller closes the connection. (The client side's [`LiveTlsClient::register`] has the
    /// same shape.)
    pub fn register(
        &self,
        ssl: &SslRef,
        peer: String,
        socket: std::os::fd::OwnedFd,
    ) -> Result<Option<Registration>, String> {
        let Some(who) = Credential::of(ssl) else { return Ok(None) };
        OpenTls::add_unless(&self.open, who, peer, socket, |who| self.get().context().and_then(|tls| tls.revokes(who)))
            .map(Some)
            .map_err(|(peer, why)| {
                tracing::warn!(%peer, "closing a TLS connection: {why}");
                why
            })
    }
}

impl OpenTls {
    /// Lists a connection in `open` until the registration returned is dropped, unless `revoked` (asked
    /// under the list's lock, which the reload's sweep holds) says why its credential is revoked: then
    /// `Err((peer, why))`, and it is not listed.
    fn add_unless(
        open: &Arc<std::sync::Mutex<OpenTls>>,
        who: Credential,
        peer: String,
        socket: std::os::fd::OwnedFd,
        revoked: impl FnOnce(&Credential) -> Option<String>,
    ) -> Result<Registration, (String, String)> {
        let mut list = open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = revoked(&who) {
            return Err((peer, why));
        }
        list.next += 1;
        let id = list.next;
        list.conns.insert(id, OpenConn { who, peer, socket });
        Ok(Registration { open: open.clone(), id })
    }
}

impl<C: HeldContext + fmt::Debug> fmt::Debug for LiveTls<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LiveTls").field(&self.get()).finish()
    }
}

/// Parses a `psk_file` (`identity:hexkey` per line); errors give the line number.
pub fn parse_psk_file(text: &str, path: &Path) -> Result<HashMap<String, Vec<u8>>, CredentialError> {
    parse_psk_lines(text, "tls.psk_file", path)
}

/// [`parse_psk_file`] for the file named by the key `key`.
fn parse_psk_lines(text: &str, key: &str, path: &Path) -> Result<HashMap<String, Vec<u8>>, CredentialError> {
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let at =
            |problem| CredentialError::PskLine { key: key.to_string(), path: path.to_path_buf(), line: n + 1, problem };
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((identity, hex)) = line.rsplit_once(':') else {
            return Err(at(PskLineProblem::Syntax));
        };
        if identity.is_empty() || identity.len() > MAX_IDENTITY_BYTES {
            return Err(at(PskLineProblem::IdentityLength { max: MAX_IDENTITY_BYTES }));
        }
        let psk = decode_hex(hex.trim()).ok_or_else(|| at(PskLineProblem::NotHex))?;
        if psk.is_empty() || psk.len() > MAX_PSK_BYTES {
            return Err(at(PskLineProblem::KeyLength { max: MAX_PSK_BYTES }));
        }
        if keys.insert(identity.to_string(), psk).is_some() {
            return Err(at(PskLineProblem::Repeated { identity: identity.to_string() }));
        }
        if keys.len() > MAX_PSK_IDENTITIES {
            return Err(at(PskLineProblem::TooMany { max: MAX_PSK_IDENTITIES }));
        }
    }
    if keys.is_empty() {
        return Err(CredentialError::file(key, path, FileProblem::NoPskIdentity));
    }
    Ok(keys)
}

/// One identity and its key from the PSK file at `path` (named by the setting `key_name`): the one named
/// `identity` (the setting `identity_key`), or the file's only one. A TLS client's `psk_file` and a
/// PARDA host's record key (`[parda_host] key_file`) are read here.
pub fn read_psk_identity(
    path: &Path,
    key_name: &str,
    identity: Option<&str>,
    identity_key: &str,
) -> Result<(String, Vec<u8>), CredentialError> {
    let text = String::from_utf8(read_secret(key_name, path)?)
        .map_err(|_| CredentialError::file(key_name, path, FileProblem::NotUtf8))?;
    let keys = parse_psk_lines(&text, key_name, path)?;
    let (id, key) = match identity {
        Some(id) => keys.get_key_value(id).ok_or_else(|| CredentialError::UnknownPskIdentity {
            identity_setting: identity_key.to_string(),
            identity: id.to_string(),
            file_setting: key_name.to_string(),
            path: path.to_path_buf(),
        })?,
        None if keys.len() == 1 => keys.iter().next().expect("one"),
        None => {
            return Err(CredentialError::PskIdentityNeeded {
                file_setting: key_name.to_string(),
                path: path.to_path_buf(),
                identities: keys.len(),
                identity_setting: identity_key.to_string(),
            })
        }
    };
    Ok((id.clone(), key.clone()))
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    // Digits only: `from_str_radix` alone also takes a sign (`+f` would read as 0x0f).
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

/// How errors name a TLS setting: a config table's key (`tls.cert`, `node_tls.ca`) or a command-line flag
/// (`--tls-ca`, `--admin-cert`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// Keys of this table.
    Table(&'static str),
    /// Flags with this prefix (`tls` gives `--tls-ca`).
    Flags(&'static str),
}

impl Naming {
    /// The name of setting `k` (`ca`, `psk_file`, ...).
    pub fn key(self, k: &str) -> String {
        match self {
            Naming::Table(t) => format!("{t}.{k}"),
            Naming::Flags(p) => format!("--{p}-{}", k.replace('_', "-")),
        }
    }
    /// The settings as a group, for errors about their combination.
    pub fn group(self) -> String {
        match self {
            Naming::Table(t) => t.to_string(),
            Naming::Flags(p) => format!("--{p}-*"),
        }
    }
}

/// Loads `cert` (PEM: the leaf, then any intermediates) and its private `key` into `b`; errors name the
/// settings (`names`) and the files, and a key that does not match the certificate. Returns when the
/// leaf expires ([`unix_time`] of its notAfter).
pub(crate) fn set_identity(
    b: &mut SslContextBuilder,
    names: Naming,
    cert: &Path,
    key: &Path,
) -> Result<Option<i64>, CredentialError> {
    let (kc, kk) = (names.key("cert"), names.key("key"));
    let on_cert = |problem| CredentialError::file(&kc, cert, problem);
    let chain = X509::stack_from_pem(&read(&kc, cert)?).map_err(|e| on_cert(FileProblem::NotPemCertificate(e)))?;
    let mut chain = chain.into_iter();
    let leaf = chain.next().ok_or_else(|| on_cert(FileProblem::NoCertificate))?;
    b.set_certificate(&leaf).map_err(|e| on_cert(FileProblem::Refused(e)))?;
    for c in chain {
        b.add_extra_chain_cert(c).map_err(|e| on_cert(FileProblem::Refused(e)))?;
    }
    let on_key = |problem| CredentialError::file(&kk, key, problem);
    let pkey = PKey::private_key_from_pem(&read_secret(&kk, key)?).map_err(|e| on_key(FileProblem::NotPemKey(e)))?;
    let mismatch = || CredentialError::KeyMismatch {
        key_setting: kk.clone(),
        key: key.to_path_buf(),
        cert_setting: kc.clone(),
        cert: cert.to_path_buf(),
    };
    if !leaf.public_key().is_ok_and(|public| public.public_eq(&pkey)) {
        return Err(mismatch());
    }
    b.set_private_key(&pkey).map_err(|e| on_key(FileProblem::Refused(e)))?;
    b.check_private_key().map_err(|_| mismatch())?;
    Ok(unix_time(leaf.not_after()))
}

/// An ASN.1 time (a certificate's notAfter) in seconds since the Unix epoch.
fn unix_time(t: &openssl::asn1::Asn1TimeRef) -> Option<i64> {
    let d = openssl::asn1::Asn1Time::from_unix(0).ok()?.diff(t).ok()?;
    Some(i64::from(d.days) * 86_400 + i64::from(d.secs))
}

/// The certificates a daemon presents, by use, for `/metrics`: when each expires
/// (`rein_tls_certificate_expiration_timestamp_seconds{use}`, read at each scrape, so a renewal a reload
/// took shows at once). Uses without a certificate (PSK, no TLS) have no series.
#[derive(Clone, Default)]
pub struct Presented(Vec<(&'static str, Holder)>);

/// Where a [`Presented`] certificate is held.
#[derive(Clone)]
enum Holder {
    /// A server's context ([`LiveTls`] or [`AdminTls`]): when its certificate expires.
    Server(Arc<dyn Fn() -> Option<i64> + Send + Sync>),
    Client(ClientSlot),
}

/// A client context that a reload may set where there was none (a gateway whose first TLS node a reload
/// adds), as [`Presented::client_slot`] reads it.
pub type ClientSlot = Arc<std::sync::RwLock<Option<LiveTlsClient>>>;

impl Presented {
    /// Adds a server's context (`nbd`, `admin`), as reloads replace it.
    pub fn server<C: HeldContext + Send + Sync + 'static>(
        mut self,
        name: &'static str,
        tls: Option<LiveTls<C>>,
    ) -> Presented {
        self.0.extend(tls.map(|t| (name, Holder::Server(Arc::new(move || t.not_after())))));
        self
    }

    /// Adds a client's context (`node_tls`, `pshift_tls`), as reloads replace it.
    pub fn client(mut self, name: &'static str, tls: Option<LiveTlsClient>) -> Presented {
        self.0.extend(tls.map(|t| (name, Holder::Client(Arc::new(RwLock::new(Some(t)))))));
        self
    }

    /// Adds a client's context held in a slot a reload may fill ([`ClientSlot`]).
    pub fn client_slot(mut self, name: &'static str, slot: ClientSlot) -> Presented {
        self.0.push((name, Holder::Client(slot)));
        self
    }

    /// Appends the expiry series (module comment of [`Presented`]) to `o`.
    pub fn metrics(&self, o: &mut String) {
        use std::fmt::Write;
        let now: Vec<(&str, i64)> = (self.0.iter())
            .filter_map(|(name, held)| {
                let t = match held {
                    Holder::Server(not_after) => not_after(),
                    Holder::Client(s) => {
                        s.read().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|t| t.get().not_after)
                    }
                };
                t.map(|t| (*name, t))
            })
            .collect();
        if now.is_empty() {
            return;
        }
        let metric = "rein_tls_certificate_expiration_timestamp_seconds";
        let _ = writeln!(
            o,
            "# HELP {metric} When the certificate the daemon presents expires (its notAfter), in seconds since the \
             Unix epoch, by use: nbd (the NBD listener), admin (the admin endpoint's HTTPS), node_tls (a gateway's \
             node links), pshift_tls (the link to the pShift controller), controller (the controller's listener). \
             A reload that takes a renewed certificate moves it.\n# TYPE {metric} gauge"
        );
        for (name, t) in now {
            let _ = writeln!(o, "{metric}{{use=\"{name}\"}} {t}");
        }
    }
}

/// Reads the PEM certificates of a `ca` file (at least one).
fn read_ca(key: &str, ca: &Path) -> Result<Vec<X509>, CredentialError> {
    let certs = X509::stack_from_pem(&read(key, ca)?)
        .map_err(|e| CredentialError::file(key, ca, FileProblem::NotPemCertificate(e)))?;
    if certs.is_empty() {
        return Err(CredentialError::file(key, ca, FileProblem::NoCertificate));
    }
    Ok(certs)
}

/// Reads the PEM CRLs of a `crl` file (at least one), each of which must be signed by a CA of `cas` (from
/// the `ca` file `ca_path`): a CRL no configured CA vouches for could revoke anyone. Errors name the
/// files and the CRL's issuer.
/// `names` names the settings (`tls.crl`, `node_tls.crl`, `--tls-crl`).
fn read_crls(
    names: Naming,
    path: &Path,
    cas: &[X509],
    ca_path: &Path,
) -> Result<Vec<openssl::x509::X509Crl>, CredentialError> {
    let key = names.key("crl");
    let at = |problem| CredentialError::file(&key, path, problem);
    let bytes = read(&key, path)?;
    let text = String::from_utf8(bytes).map_err(|_| at(FileProblem::NotPemText))?;
    const BEGIN: &str = "-----BEGIN X509 CRL-----";
    const END: &str = "-----END X509 CRL-----";
    let mut crls = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find(BEGIN) {
        let end = rest[start..].find(END).ok_or_else(|| at(FileProblem::UnterminatedCrl))? + start + END.len();
        let crl = openssl::x509::X509Crl::from_pem(&rest.as_bytes()[start..end])
            .map_err(|e| at(FileProblem::NotPemCrl(e)))?;
        let issuer = name_of(crl.issuer_name());
        let signed = cas.iter().any(|ca| {
            ca.subject_name().try_cmp(crl.issuer_name()).is_ok_and(|o| o.is_eq())
                && ca.public_key().is_ok_and(|k| crl.verify(&k).unwrap_or(false))
        });
        if !signed {
            return Err(at(FileProblem::CrlNotSigned {
                issuer,
                ca_setting: names.key("ca"),
                ca: ca_path.to_path_buf(),
            }));
        }
        crls.push(crl);
        rest = &rest[end..];
    }
    if crls.is_empty() {
        return Err(at(FileProblem::NoCrl));
    }
    Ok(crls)
}

/// The verify callback of a `crl`, on either side ("Revocation"): the chain (and, for a client, the
/// server's name) are checked by OpenSSL first; OpenSSL then calls this for each certificate of the
/// verified chain, the root's first and the peer's own last, and each is refused if a CRL of its issuer
/// lists its serial number (an intermediate CA too: its revocation revokes every certificate it signed,
/// as `openssl verify -crl_check_all` says), with the error [`TlsClient::connect`] and
/// [`TlsConfig::accept`] name as a revocation.
fn refuse_revoked(
    crls: Arc<Vec<openssl::x509::X509Crl>>,
) -> impl Fn(bool, &mut openssl::x509::X509StoreContextRef) -> bool + Send + Sync + 'static {
    move |ok, ctx| {
        if !ok {
            return ok;
        }
        if ctx.current_cert().is_some_and(|c| revoked(&crls, c)) {
            ctx.set_error(openssl::x509::X509VerifyResult::APPLICATION_VERIFICATION);
            return false;
        }
        true
    }
}

/// Why a CRL of `crls` (the setting `crl_key`) revokes a peer that presented `chain` (its certificate
/// first, then the CAs above it), or `None`: the first certificate of the chain that a CRL of its issuer
/// lists. `server` says which side the peer is, for the words (a client's are those the logs and docs
/// have said since the first release, the leaf unnamed).
fn revoked_in(crls: &[openssl::x509::X509Crl], chain: &[X509], server: bool, crl_key: &str) -> Option<String> {
    let (depth, cert) = chain.iter().enumerate().find(|(_, c)| revoked(crls, c))?;
    let leaf = match server {
        true => format!("its server's certificate ({})", name_of(chain[0].subject_name())),
        false => "its client certificate".to_string(),
    };
    Some(match depth {
        0 => format!("{leaf} is revoked ({crl_key})"),
        _ => format!("the CA {} above {leaf} is revoked ({crl_key})", name_of(cert.subject_name())),
    })
}

/// Whether a CRL of `cert`'s issuer lists its serial number as revoked.
fn revoked(crls: &[openssl::x509::X509Crl], cert: &openssl::x509::X509Ref) -> bool {
    crls.iter().any(|crl| {
        crl.issuer_name().try_cmp(cert.issuer_name()).is_ok_and(|o| o.is_eq())
            && matches!(crl.get_by_serial(cert.serial_number()), openssl::x509::CrlStatus::Revoked(_))
    })
}

/// A certificate name as errors show it: its CN, else every entry.
fn name_of(name: &openssl::x509::X509NameRef) -> String {
    let text = |e: &openssl::x509::X509NameEntryRef| e.data().to_string().map(|s| s.to_string()).unwrap_or_default();
    match name.entries_by_nid(Nid::COMMONNAME).next() {
        Some(cn) => format!("CN={}", text(cn)),
        None => name.entries().map(text).collect::<Vec<_>>().join(", "),
    }
}

/// Where a connection's PSK identity is kept between the PSK callback and [`TlsConfig::accept`].
fn psk_identity_index() -> Index<Ssl, String> {
    static INDEX: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL allocates an ex_data index"))
}

impl TlsConfig {
    /// Reads and checks the credentials and builds the server context. Errors name the key and the file:
    /// an unreadable or unparsable file, a key that does not match the certificate, a bad PSK line (with
    /// its number), `cert` without `key` or the reverse, and a mode other than off with neither `cert`
    /// nor `psk_file`.
    pub fn build(mode: TlsMode, files: TlsFiles) -> Result<TlsConfig, CredentialError> {
        if mode != TlsMode::Off && files.cert.is_none() && files.psk_file.is_none() {
            return Err(CredentialError::NoServerCredentials);
        }
        let digest = digest(&[&files.cert, &files.key, &files.ca, &files.psk_file, &files.crl]);
        let step = |step| move |error| CredentialError::Context { group: "tls".into(), step, error };
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(step("cannot create the TLS context: "))?;
        b.set_cipher_list(CIPHERS_1_2).map_err(step("cipher list: "))?;
        // SHA-256 suites first: a PSK from the callback is bound to SHA-256, and a server that prefers
        // TLS_AES_256_GCM_SHA384 would drop the client's PSK and ask a PSK-only client for a certificate.
        b.set_ciphersuites(SUITES_1_3).map_err(step("TLS 1.3 suites: "))?;
        b.set_options(SslOptions::CIPHER_SERVER_PREFERENCE);
        // OpenSSL takes a TLS 1.3 PSK from the callback as a session to resume, and refuses to resume
        // one without a session id context when client certificates are verified (`ca`): without this,
        // every PSK client of a server with both `ca` and `psk_file` failed ("session id context
        // uninitialized").
        b.set_session_id_context(b"rein-nbd").map_err(step("session id context: "))?;
        // No resumption of a certificate session: a resumed one skips verification, so it has no verified
        // chain, and a reload revoking its client's CA could not tell it (its connection stayed open).
        // Connections are long-lived; a full handshake each costs nothing that matters. External PSKs do
        // not use tickets or the cache. Test: rein's `a_saved_tls_session_is_not_resumed` (s_client
        // -sess_out, then -sess_in, over TLS 1.2 and 1.3).
        b.set_num_tickets(0).map_err(step("session tickets: "))?;
        b.set_session_cache_mode(openssl::ssl::SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
        let not_after = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => set_identity(&mut b, Naming::Table("tls"), cert, key)?,
            (Some(_), None) => {
                return Err(CredentialError::Needs { setting: "tls.cert".into(), needs: "tls.key".into() })
            }
            (None, Some(_)) => {
                return Err(CredentialError::Needs { setting: "tls.key".into(), needs: "tls.cert".into() })
            }
            (None, None) => None,
        };
        let mut crl_lists = Arc::new(Vec::new());
        if let Some(ca) = &files.ca {
            let cas = read_ca("tls.ca", ca)?;
            let refused = |e| CredentialError::file("tls.ca", ca, FileProblem::Refused(e));
            for c in &cas {
                b.add_client_ca(c).map_err(refused)?;
                b.cert_store_mut().add_cert(c.clone()).map_err(refused)?;
            }
            let verify = SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT;
            match &files.crl {
                None => b.set_verify(verify),
                Some(crl) => {
                    let crls = Arc::new(read_crls(Naming::Table("tls"), crl, &cas, ca)?);
                    crl_lists = crls.clone();
                    b.set_verify_callback(verify, refuse_revoked(crls));
                }
            }
        } else if files.crl.is_some() {
            return Err(CredentialError::ServerCrlWithoutCa);
        }
        let mut psk = None;
        let mut psk_identities = None;
        if let Some(path) = &files.psk_file {
            let text = String::from_utf8(read_secret("tls.psk_file", path)?)
                .map_err(|_| CredentialError::file("tls.psk_file", path, FileProblem::NotUtf8))?;
            let keys = parse_psk_file(&text, path)?;
            psk = Some((path.clone(), keys.len()));
            psk_identities = Some(Arc::new(keys.keys().cloned().collect()));
            b.set_psk_server_callback(move |ssl: &mut SslRef, identity: Option<&[u8]>, out: &mut [u8]| {
                let known = identity.and_then(|i| std::str::from_utf8(i).ok()).and_then(|i| keys.get_key_value(i));
                match known {
                    Some((identity, key)) if key.len() <= out.len() => {
                        out[..key.len()].copy_from_slice(key);
                        ssl.set_ex_data(psk_identity_index(), identity.clone());
                        Ok(key.len())
                    }
                    _ => Ok(0), // unknown identity: the handshake fails
                }
            });
        }
        Ok(TlsConfig {
            mode,
            cert: files.cert,
            ca: files.ca,
            psk,
            digest,
            not_after,
            crls: crl_lists,
            psk_identities,
            exposed: [("tls.key", &files.key), ("tls.psk_file", &files.psk_file)]
                .into_iter()
                .filter_map(|(key, path)| exposed(key, path.as_deref()?))
                .collect(),
            acceptor: Arc::new(b.build()),
        })
    }

    /// What a reload that replaces `old` by `new` changes, in words for its log line (`mode on ->
    /// require, new credentials`), or `None` if nothing: the same mode, files and bytes. `None` stands
    /// for no table (TLS off).
    pub fn change(old: Option<&TlsConfig>, new: Option<&TlsConfig>) -> Option<String> {
        let mode = |t: Option<&TlsConfig>| t.map_or(TlsMode::Off, |t| t.mode);
        let name = |m: TlsMode| match m {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        };
        let mut what = Vec::new();
        if mode(old) != mode(new) {
            what.push(format!("mode {} -> {}", name(mode(old)), name(mode(new))));
        }
        if old.map(|t| t.digest) != new.map(|t| t.digest) {
            what.push("new credentials (the cert, key, ca, crl or psk_file, or their contents)".to_string());
        }
        (!what.is_empty()).then(|| what.join(", "))
    }

    /// A warning for a certificate that has expired or expires within [`EXPIRY_WARNING_DAYS`] of `now`
    /// (seconds since the Unix epoch), for the start's and each reload's log: clients that check
    /// certificates refuse an expired one, while the server still serves those that do not.
    pub fn expiry_warning(&self, now: i64) -> Option<String> {
        let (end, cert) = (self.not_after?, self.cert.as_ref()?);
        if end < now {
            Some(format!(
                "tls.cert {} expired {} ago: clients that check certificates refuse it; renew it and reload (SIGHUP)",
                cert.display(),
                span(now - end)
            ))
        } else if end - now < EXPIRY_WARNING_DAYS * 86_400 {
            Some(format!("tls.cert {} expires in {}: renew it and reload (SIGHUP)", cert.display(), span(end - now)))
        } else {
            None
        }
    }

    /// `--check-config`'s lines for `[tls]`: the mode and what it checks, and when the certificate
    /// expires; then the expiry's warning, if any ([`TlsConfig::expiry_warning`]), and one for each
    /// secret file every user may read ([`exposed`]).
    pub fn describe(&self, now: i64) -> Vec<String> {
        let mode = match self.mode {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        };
        let mut parts = vec![format!("tls: mode {mode}")];
        if let (Some(cert), Some(end)) = (&self.cert, self.not_after) {
            parts.push(match end - now {
                left if left >= 0 => format!("certificate {} expires in {}", cert.display(), span(left)),
                late => format!("certificate {} expired {} ago", cert.display(), span(-late)),
            });
        }
        if let Some(ca) = &self.ca {
            let crl = if self.crls.is_empty() {
                String::new()
            } else {
                let n: usize = self.crls.iter().map(|c| c.get_revoked().map_or(0, |r| r.len())).sum();
                format!(" and {}", rein_core::Count(n, "revoked certificate"))
            };
            parts.push(format!("client certificates checked against {}{crl}", ca.display()));
        }
        if let Some((path, n)) = &self.psk {
            parts.push(format!("psk_file {} ({})", path.display(), rein_core::Count(*n, "identity")));
        }
        let warnings = self.expiry_warning(now).into_iter().chain(self.exposed.iter().cloned());
        std::iter::once(parts.join("; ")).chain(warnings.map(|w| format!("warning: {w}"))).collect()
    }

    /// Why this context would refuse a client that opened its session as `who` (a reload's question for
    /// the connections open, [`LiveTls::set`]): its certificate listed in `crl`, or its PSK identity gone
    /// from `psk_file`. `None`: it would be accepted as far as revocation goes.
    fn revokes(&self, who: &Credential) -> Option<String> {
        match who {
            Credential::Cert(chain) => revoked_in(&self.crls, chain, false, "tls.crl"),
            Credential::Psk(id) if self.psk_identities.as_ref().is_none_or(|ids| !ids.contains(id)) => {
                Some("its PSK identity is no longer in tls.psk_file".to_string())
            }
            Credential::Psk(_) => None,
        }
    }

    /// Whether the server has a certificate (`cert`/`key`), which HTTPS clients need (a PSK-only
    /// context cannot serve them).
    pub fn has_certificate(&self) -> bool {
        self.cert.is_some()
    }

    /// `stream` wrapped for a TLS server, the handshake not yet run (no IO here): the caller drives it
    /// with [`SslStream::poll_accept`] (the admin endpoint does, inside its connection's first poll).
    pub fn server_stream<S: AsyncRead + AsyncWrite>(&self, stream: S) -> Result<SslStream<S>, TlsError> {
        let ssl = Ssl::new(self.acceptor.context()).map_err(|e| TlsError(e.to_string()))?;
        SslStream::new(ssl, stream).map_err(|e| TlsError(e.to_string()))
    }

    /// Runs the TLS handshake as the server on `stream`; returns the TLS stream and the client's identity
    /// (module comment), if it has one.
    pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: S,
    ) -> Result<(SslStream<S>, Option<String>), TlsError> {
        let mut tls = self.server_stream(stream)?;
        if let Err(e) = Pin::new(&mut tls).accept().await {
            // The CRL's refusal (`crl`) is the one the verify callback sets: say so.
            let revoked = tls.ssl().verify_result() == openssl::x509::X509VerifyResult::APPLICATION_VERIFICATION;
            let why =
                if revoked { " (the client's certificate is revoked: tls.crl lists it or a CA above it)" } else { "" };
            return Err(TlsError(format!("{e}{why}")));
        }
        let ssl = tls.ssl();
        let identity = psk_identity(ssl).cloned().or_else(|| {
            let cert = ssl.peer_certificate()?;
            let cn = cert.subject_name().entries_by_nid(Nid::COMMONNAME).next()?;
            cn.data().to_string().ok()
        });
        Ok((tls, identity))
    }
}

/// A client TLS table as a config file writes it: the gateway's `[node_tls]` and rein serve's
/// `[pshift.tls]` (one table, one parser, one builder). Paths are relative to the file's directory.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsTable {
    /// See [`TlsClientFiles::ca`].
    pub ca: Option<String>,
    /// See [`TlsClientFiles::cert`].
    pub cert: Option<String>,
    /// See [`TlsClientFiles::key`].
    pub key: Option<String>,
    /// See [`TlsClientFiles::psk_file`].
    pub psk_file: Option<String>,
    /// See [`TlsClientFiles::psk_identity`].
    pub psk_identity: Option<String>,
    /// See [`TlsClientFiles::crl`].
    pub crl: Option<String>,
    /// The name the server's certificate must carry (`[pshift.tls]`; a gateway names each node's in
    /// `[[nodes]] tls_name`).
    pub name: Option<String>,
}

impl ClientTlsTable {
    /// The client context, its files resolved against `base`; errors name the table `table`.
    pub fn build(&self, base: &Path, table: &'static str) -> Result<TlsClient, CredentialError> {
        let path = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
        let files = TlsClientFiles {
            ca: path(&self.ca),
            cert: path(&self.cert),
            key: path(&self.key),
            psk_file: path(&self.psk_file),
            psk_identity: self.psk_identity.clone(),
            crl: path(&self.crl),
        };
        TlsClient::build(Naming::Table(table), files)
    }
}

/// The files of a client TLS table (`[node_tls]` in gw.toml), resolved against the config file's
/// directory.
#[derive(Debug, Clone, Default)]
pub struct TlsClientFiles {
    /// `ca`: the servers' certificates must chain to one of these (x509).
    pub ca: Option<PathBuf>,
    /// `cert`: the client's certificate, presented when the server asks (with `key`).
    pub cert: Option<PathBuf>,
    /// `key`.
    pub key: Option<PathBuf>,
    /// `psk_file`: `identity:hexkey` lines (PSK instead of x509).
    pub psk_file: Option<PathBuf>,
    /// `psk_identity`: which line of `psk_file` (default: its only one).
    pub psk_identity: Option<String>,
    /// `crl` (with `ca`): revoked server certificates (PEM CRLs, each signed by a CA of `ca`, as a
    /// server's `[tls] crl`).
    pub crl: Option<PathBuf>,
}

/// A client's TLS context (the gateway's links to its storage nodes), built and checked once.
///
/// - **x509** (`ca`): the server's certificate must chain to `ca` (only to it: the system's roots are
///   not trusted) and name the server (`connect`'s `name`: a DNS name, or an IP address matched against
///   the certificate's IP subjectAltName). With `cert` and `key` the client presents its certificate
///   when the server asks (a node with `[tls] ca`); its CN is then the client's identity there.
/// - **PSK** (`psk_file`, and `psk_identity` when the file has more than one line): the identity and key
///   are offered; a server that does not know them fails the handshake. No certificate is trusted, so a
///   server that answers with a certificate instead of the PSK fails it too.
///
/// Exactly one of `ca` and `psk_file`. TLS 1.2 and 1.3, the server's suites as in [`TlsConfig`].
#[derive(Clone)]
pub struct TlsClient {
    connector: Arc<SslConnector>,
    /// The PSK identity, if PSK.
    psk_identity: Option<String>,
    /// Where the credentials came from (for `Debug`).
    files: TlsClientFiles,
    /// A digest of the files' paths and bytes ([`digest`]).
    digest: u64,
    /// When `cert` expires (seconds since the Unix epoch), for `/metrics` ([`Presented`]).
    not_after: Option<i64>,
    /// `crl`'s lists (empty without one), for the links a reload cuts ([`LiveTlsClient::cut_revoked`]).
    crls: Arc<Vec<openssl::x509::X509Crl>>,
    /// How errors name `crl` (`node_tls.crl`, `--tls-crl`).
    crl_key: String,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("files", &self.files)
            .field("psk_identity", &self.psk_identity)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Reads and checks the credentials and builds the context; errors name the settings as `names` says
    /// (`node_tls.ca`, `--tls-ca`) and the file.
    pub fn build(names: Naming, files: TlsClientFiles) -> Result<TlsClient, CredentialError> {
        let k = |s: &str| names.key(s);
        let needs = |setting: &str, needs: &str| CredentialError::Needs { setting: k(setting), needs: k(needs) };
        let digest = digest(&[&files.ca, &files.cert, &files.key, &files.psk_file, &files.crl]);
        let step = |step| move |error| CredentialError::Context { group: names.group(), step, error };
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(step("cannot create the TLS context: "))?;
        b.set_cipher_list(CIPHERS_1_2).map_err(step("cipher list: "))?;
        b.set_ciphersuites(SUITES_1_3).map_err(step("TLS 1.3 suites: "))?;
        // Only the configured CA: a node's certificate signed by any public root must not pass.
        let mut store = X509StoreBuilder::new().map_err(step(""))?;
        let mut psk_identity = None;
        let mut not_after = None;
        let mut crls = Vec::new();
        match (&files.ca, &files.psk_file) {
            (Some(ca), None) => {
                let cas = read_ca(&k("ca"), ca)?;
                if let Some(crl) = &files.crl {
                    crls = read_crls(names, crl, &cas, ca)?;
                }
                for c in cas {
                    store.add_cert(c).map_err(|e| CredentialError::file(&k("ca"), ca, FileProblem::Refused(e)))?;
                }
                match (&files.cert, &files.key) {
                    (Some(cert), Some(key)) => not_after = set_identity(&mut b, names, cert, key)?,
                    (Some(_), None) => return Err(needs("cert", "key")),
                    (None, Some(_)) => return Err(needs("key", "cert")),
                    (None, None) => {}
                }
                if files.psk_identity.is_some() {
                    return Err(needs("psk_identity", "psk_file"));
                }
            }
            (None, Some(path)) => {
                if files.crl.is_some() {
                    return Err(CredentialError::ClientCrlWithoutCa { names });
                }
                if files.cert.is_some() || files.key.is_some() {
                    return Err(CredentialError::ClientCertWithPsk { names });
                }
                let (identity, key) =
                    read_psk_identity(path, &k("psk_file"), files.psk_identity.as_deref(), &k("psk_identity"))?;
                psk_identity = Some(identity.clone());
                b.set_psk_client_callback(move |_ssl, _hint, id_out: &mut [u8], key_out: &mut [u8]| {
                    // The identity is written NUL-terminated; both fit (OpenSSL's buffers are its maxima).
                    let id = identity.as_bytes();
                    if id.len() >= id_out.len() || key.len() > key_out.len() {
                        return Ok(0);
                    }
                    id_out[..id.len()].copy_from_slice(id);
                    id_out[id.len()] = 0;
                    key_out[..key.len()].copy_from_slice(&key);
                    Ok(key.len())
                });
            }
            (Some(_), Some(_)) => return Err(CredentialError::ClientCaAndPsk { names }),
            (None, None) => return Err(CredentialError::ClientNoCredentials { names }),
        }
        b.set_cert_store(store.build());
        let crls = Arc::new(crls);
        if crls.is_empty() {
            b.set_verify(SslVerifyMode::PEER);
        } else {
            b.set_verify_callback(SslVerifyMode::PEER, refuse_revoked(Arc::clone(&crls)));
        }
        let crl_key = k("crl");
        Ok(TlsClient { connector: Arc::new(b.build()), psk_identity, files, digest, not_after, crls, crl_key })
    }

    /// Whether `new` differs from `self` in its files, their bytes or the PSK identity it offers (a
    /// reload's question, module comment "Reload").
    pub fn changed(&self, new: &TlsClient) -> bool {
        self.digest != new.digest || self.psk_identity != new.psk_identity
    }

    /// The PSK identity offered, if PSK.
    pub fn psk_identity(&self) -> Option<&str> {
        self.psk_identity.as_deref()
    }

    /// Runs the TLS handshake as the client on `stream` to the server `name` (a DNS name or an IP
    /// address its certificate must carry; unused with PSK).
    pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        name: &str,
        stream: S,
    ) -> Result<SslStream<S>, TlsError> {
        let mut config = self.connector.configure().map_err(|e| TlsError(e.to_string()))?;
        if self.psk_identity.is_some() {
            config.set_verify_hostname(false);
        }
        let ssl = config.into_ssl(name).map_err(|e| TlsError(e.to_string()))?;
        let mut tls = SslStream::new(ssl, stream).map_err(|e| TlsError(e.to_string()))?;
        Pin::new(&mut tls).connect().await.map_err(|e| {
            let verify = tls.ssl().verify_result();
            let mut msg = match verify {
                openssl::x509::X509VerifyResult::OK => e.to_string(),
                // Only the CRL's check sets it (`build`).
                openssl::x509::X509VerifyResult::APPLICATION_VERIFICATION => {
                    format!("{e} (the server's certificate is revoked: {} lists it or a CA above it)", self.crl_key)
                }
                v => format!("{e} ({})", v.error_string()),
            };
            // OpenSSL names only the alert the server sent ("illegal parameter" for a PSK binder made
            // with another key); say what it means for a PSK client.
            if let (Some(id), true) = (&self.psk_identity, msg.contains("alert")) {
                msg.push_str(&format!(
                    " (the server refused PSK identity {id:?}: it does not know it, or holds another key for it)"
                ));
            }
            TlsError(msg)
        })?;
        Ok(tls)
    }
}

/// A client's TLS context that a reload replaces (module comment, "Reload"), and the links open under it
/// (those that registered): clones share both.
#[derive(Clone)]
pub struct LiveTlsClient {
    client: Arc<RwLock<TlsClient>>,
    open: Arc<std::sync::Mutex<OpenTls>>,
}

impl LiveTlsClient {
    /// Holds `client`.
    pub fn new(client: TlsClient) -> LiveTlsClient {
        LiveTlsClient { client: Arc::new(RwLock::new(client)), open: Arc::default() }
    }

    /// The context now: a connection takes it once, when it starts.
    pub fn get(&self) -> TlsClient {
        self.client.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the context for the connections from now on (the open ones keep theirs; a reload that
    /// completes then cuts those it revokes, [`LiveTlsClient::cut_revoked`]).
    pub fn set(&self, client: TlsClient) {
        *self.client.write().unwrap_or_else(|e| e.into_inner()) = client;
    }

    /// Lists an open link to `peer` (how logs name it) whose server presented `ssl`'s certificate chain,
    /// with a duplicate of its socket (`socket`) to cut it by; it stays listed while the registration
    /// lives. `Ok(None)` with PSK (no certificate to revoke). As [`LiveTls::register`], the chain is
    /// checked against the context now, under the lock [`LiveTlsClient::cut_revoked`] sweeps under:
    /// `Err(why)` (also logged) if its `crl` revokes the server since the handshake began, and the
    /// caller closes the link.
    pub fn register(
        &self,
        ssl: &SslRef,
        peer: String,
        socket: std::os::fd::OwnedFd,
    ) -> Result<Option<Registration>, String> {
        let Some(who @ Credential::Cert(_)) = Credential::of(ssl) else { return Ok(None) };
        OpenTls::add_unless(&self.open, who, peer, socket, |who| {
            let client = self.get();
            let Credential::Cert(chain) = who else { return None };
            revoked_in(&client.crls, chain, true, &client.crl_key)
        })
        .map(Some)
        .map_err(|(peer, why)| {
            tracing::warn!(%peer, "closing a TLS link: {why}");
            why
        })
    }

    /// Cuts the open links whose server's certificate the context now revokes (its `crl` lists it): their
    /// sockets are shut down, so their reads end, the requests in flight fail, and the link reconnects
    /// with the context now, which refuses that server. Returns one line per link cut, each also logged;
    /// a link is cut once, however many clones ask.
    pub fn cut_revoked(&self) -> Vec<String> {
        let client = self.get();
        if client.crls.is_empty() {
            return Vec::new();
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut cut = Vec::new();
        open.conns.retain(|_, c| {
            let Credential::Cert(chain) = &c.who else { return true };
            let Some(why) = revoked_in(&client.crls, chain, true, &client.crl_key) else { return true };
            let _ = socket2::SockRef::from(&c.socket).shutdown(std::net::Shutdown::Both);
            tracing::warn!(peer = %c.peer, "closing a TLS link: {why}");
            cut.push(format!("{}: {why}", c.peer));
            false
        });
        cut
    }
}

impl fmt::Debug for LiveTlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LiveTlsClient").field(&self.get()).finish()
    }
}

/// A connection (TCP or Unix, [`crate::sock::Sock`]) in the clear or after STARTTLS: what an NBD server's
/// handshake leaves ([`crate::nbd`]) and a gateway's link to a node ([`crate::remote`]).
pub(crate) enum NbdStream {
    Plain(crate::sock::Sock),
    Tls(Box<SslStream<crate::sock::Sock>>),
}

impl NbdStream {
    /// Reads into `buf`'s spare capacity, as [`tokio::io::AsyncReadExt::read_buf`].
    pub(crate) async fn read_buf(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        use tokio::io::AsyncReadExt;
        match self {
            NbdStream::Plain(s) => s.read_buf(buf).await,
            NbdStream::Tls(s) => s.read_buf(buf).await,
        }
    }

    /// Writes all of `data`, as [`tokio::io::AsyncWriteExt::write_all`].
    pub(crate) async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            NbdStream::Plain(s) => s.write_all(data).await,
            NbdStream::Tls(s) => s.write_all(data).await,
        }
    }

    /// Shuts the writing side down (over TLS, with its close_notify first), as
    /// [`tokio::io::AsyncWriteExt::shutdown`].
    pub(crate) async fn shutdown(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            NbdStream::Plain(s) => s.shutdown().await,
            NbdStream::Tls(s) => s.shutdown().await,
        }
    }
}

/// A failed TLS handshake: OpenSSL's reason (an unknown CA, a missing client certificate, an unknown
/// PSK identity, a client that speaks no TLS).
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake failed: {0}")]
pub struct TlsError(pub String);

#[cfg(test)]
mod tests {
    use super::*;
    use rein_testkit::pki;

    /// A client that knows a PSK identity's name but not its key, offering it with a wrong key and
    /// TLS_AES_256_GCM_SHA384 alone (OpenSSL looks the identity up, then drops the PSK for the suite's
    /// hash and goes on with the server's certificate), is no one; with the key it is the identity.
    /// Before, the first was taken for `alice` (module comment).
    #[tokio::test]
    async fn a_psk_identity_counts_only_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        pki::make_ca(d, "srv", "srv"); // a self-signed certificate
        let key = [0x11u8; 16];
        std::fs::write(d.join("keys.psk"), format!("alice:{}\n", "11".repeat(16))).unwrap();
        let files = TlsFiles {
            cert: Some(d.join("srv-cert.pem")),
            key: Some(d.join("srv-key.pem")),
            psk_file: Some(d.join("keys.psk")),
            ..TlsFiles::default()
        };
        let server = TlsConfig::build(TlsMode::Require, files).unwrap();
        for (right_key, want) in [(false, None), (true, Some("alice".to_string()))] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
                b.set_verify(SslVerifyMode::NONE);
                if !right_key {
                    b.set_ciphersuites("TLS_AES_256_GCM_SHA384").unwrap();
                }
                b.set_psk_client_callback(move |_, _, id, out| {
                    id[..6].copy_from_slice(b"alice\0");
                    out[..16].copy_from_slice(&if right_key { key } else { [0xee; 16] });
                    Ok(16)
                });
                let mut c = b.build().configure().unwrap();
                c.set_verify_hostname(false);
                c.connect("srv", std::net::TcpStream::connect(addr).unwrap()).map(|_| ()).map_err(|e| e.to_string())
            });
            let (sock, _) = l.accept().await.unwrap();
            let (tls, identity) = server.accept(sock).await.unwrap();
            client.join().unwrap().unwrap();
            assert_eq!(identity, want, "right key: {right_key}");
            assert_eq!(matches!(Credential::of(tls.ssl()), Some(Credential::Psk(_))), right_key);
        }
    }

    /// A test PKI in a directory (rein-testkit's `pki`, the `openssl` command): a root CA, an intermediate CA
    /// it signed, a client certificate under each (bob under the intermediate, alice under the root),
    /// and the server's certificate; CRLs are `pki::revoke` and `pki::make_crl` in [`Pki::dir`].
    struct Pki(tempfile::TempDir);

    impl Pki {
        fn new() -> Pki {
            let pki = Pki(tempfile::tempdir().unwrap());
            let d = pki.dir();
            pki::make_ca(d, "root", "root");
            pki::make_cert(d, "root", "mid", "mid", pki::CA);
            pki::make_cert(d, "mid", "bob", "bob", pki::CLIENT);
            pki::make_cert(d, "root", "alice", "alice", pki::CLIENT);
            pki::make_cert(d, "root", "srv", "srv", &pki::server("DNS:srv"));
            pki
        }

        fn dir(&self) -> &Path {
            self.0.path()
        }

        /// A server context: `ca` the root, `crl` the file `crl`.
        fn server(&self, crl: &str) -> TlsConfig {
            let d = self.dir();
            let files = TlsFiles {
                cert: Some(d.join("srv-cert.pem")),
                key: Some(d.join("srv-key.pem")),
                ca: Some(d.join("root-cert.pem")),
                crl: Some(d.join(crl)),
                ..TlsFiles::default()
            };
            TlsConfig::build(TlsMode::Require, files).unwrap()
        }

        /// Runs a handshake of `client` (with the intermediate's certificate after its own when it is
        /// `bob`) against `server`: the server's stream, or its error.
        async fn handshake(
            &self,
            server: &TlsConfig,
            client: &str,
        ) -> Result<SslStream<tokio::net::TcpStream>, TlsError> {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let d = self.dir().to_path_buf();
            let client = client.to_string();
            let connecting = std::thread::spawn(move || {
                let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
                b.set_verify(SslVerifyMode::NONE);
                b.set_certificate_file(d.join(format!("{client}-cert.pem")), openssl::ssl::SslFiletype::PEM).unwrap();
                b.set_private_key_file(d.join(format!("{client}-key.pem")), openssl::ssl::SslFiletype::PEM).unwrap();
                if client == "bob" {
                    b.add_extra_chain_cert(X509::from_pem(&std::fs::read(d.join("mid-cert.pem")).unwrap()).unwrap())
                        .unwrap();
                }
                let tcp = std::net::TcpStream::connect(addr).unwrap();
                b.build().connect("srv", tcp).map(drop).map_err(|e| e.to_string())
            });
            let (sock, _) = l.accept().await.unwrap();
            let accepted = server.accept(sock).await.map(|(tls, _)| tls);
            let _ = connecting.join().unwrap();
            accepted
        }
    }

    fn socket_of(tls: &SslStream<tokio::net::TcpStream>) -> std::os::fd::OwnedFd {
        std::os::fd::AsFd::as_fd(tls.get_ref()).try_clone_to_owned().unwrap()
    }

    /// A handshake that ran under a context which did not revoke the client, completed after a reload
    /// to one that does, is refused when it registers, and logged as a cut; a client the new context
    /// does not revoke registers. Before, the registration was taken whatever the context now said: a
    /// client that held its TCP connection across the revoking reload (the handshake takes its context
    /// when it starts) was served until the next reload.
    #[tokio::test]
    async fn a_handshake_under_a_context_since_revoked_is_refused_at_registration() {
        let pki = Pki::new();
        pki::make_crl(pki.dir(), "root", "before.pem");
        let before = pki.server("before.pem");
        let live = LiveTls::new(Some(before.clone()));
        let bob = pki.handshake(&before, "bob").await.unwrap();
        let alice = pki.handshake(&before, "alice").await.unwrap();
        pki::revoke(pki.dir(), "root", "alice");
        pki::make_crl(pki.dir(), "root", "after.pem");
        assert_eq!(live.set(Some(pki.server("after.pem"))), Vec::<String>::new(), "no one registered yet");
        let e = live.register(alice.ssl(), "alice's peer".into(), socket_of(&alice)).err();
        assert_eq!(e.as_deref(), Some("its client certificate is revoked (tls.crl)"));
        let kept = live.register(bob.ssl(), "bob's peer".into(), socket_of(&bob)).unwrap();
        assert!(kept.is_some(), "bob is not revoked: listed");
        assert_eq!(live.open.lock().unwrap().conns.len(), 1);
    }

    /// An intermediate CA that the root's CRL lists revokes the clients it signed: their handshake
    /// fails as `openssl verify -crl_check_all` fails their chain, and a reload to that CRL cuts their
    /// open connections, naming the CA; a client the root signed is not touched. Before, only the
    /// client's own certificate was looked up (the callback returned at any depth but 0, and the
    /// reload's sweep held only the leaf).
    #[tokio::test]
    async fn a_revoked_intermediate_ca_revokes_its_clients() {
        let pki = Pki::new();
        pki::make_crl(pki.dir(), "root", "none.pem");
        pki::revoke(pki.dir(), "root", "mid");
        pki::make_crl(pki.dir(), "root", "mid-revoked.pem");
        let revoking = pki.server("mid-revoked.pem");
        let Err(e) = pki.handshake(&revoking, "bob").await else { panic!("bob's CA is revoked") };
        assert!(e.0.contains("the client's certificate is revoked: tls.crl lists it or a CA above it"), "{e}");
        pki.handshake(&revoking, "alice").await.expect("alice's CA is the root");

        let live = LiveTls::new(Some(pki.server("none.pem")));
        let before = live.get().unwrap();
        let bob = pki.handshake(&before, "bob").await.unwrap();
        let alice = pki.handshake(&before, "alice").await.unwrap();
        let _bob = live.register(bob.ssl(), "bob's peer".into(), socket_of(&bob)).unwrap();
        let _alice = live.register(alice.ssl(), "alice's peer".into(), socket_of(&alice)).unwrap();
        assert_eq!(
            live.set(Some(revoking)),
            ["bob's peer: the CA CN=mid above its client certificate is revoked (tls.crl)"]
        );
    }

    /// A private key or PSK file every user may read is warned of, naming the setting, the file and the
    /// mode, and `--check-config` shows it; at 600 or 640 (a group) it is not. Before, no secret file's
    /// mode was looked at.
    #[test]
    fn a_secret_file_every_user_can_read_is_warned_of() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("keys.psk");
        std::fs::write(&path, "alice:00ff\n").unwrap();
        let lines = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let files = TlsFiles { psk_file: Some(path.clone()), ..TlsFiles::default() };
            TlsConfig::build(TlsMode::Require, files).unwrap().describe(0)
        };
        let want = format!("warning: tls.psk_file {} is readable by every user (mode 644): chmod 600", path.display());
        assert_eq!(lines(0o644)[1..], [want]);
        assert_eq!(lines(0o600).len(), 1, "owner only");
        assert_eq!(lines(0o640).len(), 1, "a group may read it");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
        let w = exposed("node_tls.key", &path).unwrap_or_default();
        assert!(
            w.starts_with("node_tls.key ") && w.ends_with("is readable by every user (mode 604): chmod 600"),
            "{w}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o602)).unwrap();
        assert!(exposed("k", &path).unwrap_or_default().contains("is writable by every user (mode 602)"));
    }

    fn parse(text: &str) -> Result<HashMap<String, Vec<u8>>, String> {
        parse_psk_file(text, Path::new("keys.psk")).map_err(|e| e.to_string())
    }

    /// The refusals are typed: the variant names the setting, the file and (for a PSK file) the line, and
    /// what is wrong, with its bound; the messages are those of before.
    #[test]
    fn credential_errors_are_typed() {
        let line = |text: &str| match parse_psk_file(text, Path::new("keys.psk")) {
            Err(CredentialError::PskLine { key, path, line, problem }) => {
                assert_eq!((key.as_str(), path.as_path()), ("tls.psk_file", Path::new("keys.psk")));
                (line, problem)
            }
            other => panic!("not a line's refusal: {other:?}"),
        };
        assert_eq!(line("a:00\nb:0"), (2, PskLineProblem::NotHex));
        assert_eq!(line(&format!("a:{}", "ab".repeat(MAX_PSK_BYTES + 1))), (1, PskLineProblem::KeyLength { max: 512 }));
        assert_eq!(line("\n:00"), (2, PskLineProblem::IdentityLength { max: 128 }));
        assert_eq!(line("a:00\na:01"), (2, PskLineProblem::Repeated { identity: "a".into() }));
        let e = parse_psk_file("\n", Path::new("keys.psk")).unwrap_err();
        assert!(
            matches!(&e, CredentialError::File { key, problem: FileProblem::NoPskIdentity, .. } if key == "tls.psk_file"),
            "{e:?}"
        );
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing.pem");
        let files = TlsFiles { cert: Some(missing.clone()), key: Some(missing.clone()), ..TlsFiles::default() };
        let e = TlsConfig::build(TlsMode::Require, files).unwrap_err();
        assert!(
            matches!(&e, CredentialError::File { key, path, problem: FileProblem::Io(io) }
                if key == "tls.cert" && *path == missing && io.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        assert_eq!(e.to_string(), format!("tls.cert {}: No such file or directory (os error 2)", missing.display()));
        let junk = tmp.path().join("junk.pem");
        std::fs::write(&junk, "not pem\n").unwrap();
        let files = TlsFiles { ca: Some(junk.clone()), psk_file: Some(junk.clone()), ..TlsFiles::default() };
        let e = TlsConfig::build(TlsMode::On, files).unwrap_err();
        assert!(
            matches!(&e, CredentialError::File { key, problem: FileProblem::NoCertificate, .. } if key == "tls.ca"),
            "{e:?}"
        );
        let files = TlsFiles { key: Some(junk.clone()), psk_file: Some(junk.clone()), ..TlsFiles::default() };
        let e = TlsConfig::build(TlsMode::On, files).unwrap_err();
        assert!(matches!(&e, CredentialError::Needs { setting, needs } if setting == "tls.key" && needs == "tls.cert"));
        // A client's refusals name its settings as the caller does: a table's keys, or flags.
        let client = |names, files| TlsClient::build(names, files).unwrap_err();
        let both = TlsClientFiles { ca: Some(junk.clone()), psk_file: Some(junk.clone()), ..Default::default() };
        let e = client(Naming::Flags("tls"), both);
        assert!(matches!(e, CredentialError::ClientCaAndPsk { names: Naming::Flags("tls") }), "{e:?}");
        assert_eq!(e.to_string(), "--tls-*: give --tls-ca (x509) or --tls-psk-file (PSK), not both");
        let crl = TlsClientFiles { psk_file: Some(junk.clone()), crl: Some(junk.clone()), ..Default::default() };
        let e = client(Naming::Table("node_tls"), crl);
        assert!(matches!(e, CredentialError::ClientCrlWithoutCa { names: Naming::Table("node_tls") }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "node_tls.crl needs node_tls.ca: it revokes server certificates, which only node_tls.ca checks"
        );
        let e = client(Naming::Table("node_tls"), TlsClientFiles::default());
        assert_eq!(
            e.to_string(),
            "node_tls needs node_tls.ca (x509: the CA of the servers' certificates) or node_tls.psk_file"
        );
        let junk_ca = TlsClientFiles { ca: Some(junk.clone()), ..Default::default() };
        let e = client(Naming::Table("node_tls"), junk_ca);
        assert!(matches!(&e, CredentialError::File { key, .. } if key == "node_tls.ca"), "{e:?}");
    }

    #[test]
    fn psk_lines_at_their_bounds() {
        let id = |n: usize| "i".repeat(n);
        let key = |n: usize| "ab".repeat(n);
        let ok = parse(&format!("{}:{}\n\nbob:00ff\r\n", id(MAX_IDENTITY_BYTES), key(MAX_PSK_BYTES))).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok["bob"], [0, 255]);
        let e = parse(&format!("{}:00", id(MAX_IDENTITY_BYTES + 1))).unwrap_err();
        assert_eq!(e, "tls.psk_file keys.psk line 1: the identity must have 1..=128 bytes");
        let e = parse(&format!("a:00\nb:{}", key(MAX_PSK_BYTES + 1))).unwrap_err();
        assert_eq!(e, "tls.psk_file keys.psk line 2: the key must have 1..=512 bytes");
        assert!(parse("a:0").unwrap_err().ends_with("line 1: the key is not hexadecimal"));
        assert!(parse("a:").unwrap_err().ends_with("line 1: the key must have 1..=512 bytes"));
        assert!(parse(":00").unwrap_err().contains("the identity must have"));
        assert!(parse("nokey").unwrap_err().ends_with("line 1: expected identity:hexkey"));
        assert!(parse("a:00\na:01").unwrap_err().ends_with("line 2: identity \"a\" is repeated"));
        assert_eq!(parse("\n\n").unwrap_err(), "tls.psk_file keys.psk: no identity in it");
        // The identity may contain ':' (the key is after the last one).
        assert_eq!(parse("a:b:0102").unwrap()["a:b"], [1, 2]);
    }

    #[test]
    fn psk_identities_at_their_bound() {
        let lines = |n: usize| (0..n).map(|i| format!("u{i}:00\n")).collect::<String>();
        assert_eq!(parse(&lines(MAX_PSK_IDENTITIES)).unwrap().len(), MAX_PSK_IDENTITIES);
        let e = parse(&lines(MAX_PSK_IDENTITIES + 1)).unwrap_err();
        assert_eq!(e, format!("tls.psk_file keys.psk line {}: more than 65536 identities", MAX_PSK_IDENTITIES + 1));
    }

    /// What a reload says of `[tls]`: nothing for the same mode, files and bytes; the mode; new bytes
    /// under the same name; and no table as off.
    #[test]
    fn a_reload_names_what_changed_in_tls() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("keys.psk");
        let build = |mode, key: &str| {
            std::fs::write(&path, format!("alice:{key}\n")).unwrap();
            TlsConfig::build(mode, TlsFiles { psk_file: Some(path.clone()), ..TlsFiles::default() }).unwrap()
        };
        let a = build(TlsMode::Require, "00ff");
        let same = build(TlsMode::Require, "00ff");
        assert_eq!(TlsConfig::change(Some(&a), Some(&same)), None);
        assert_eq!(
            TlsConfig::change(Some(&a), Some(&build(TlsMode::On, "00ff"))).as_deref(),
            Some("mode require -> on")
        );
        let renewed = build(TlsMode::Require, "01ff");
        let what = TlsConfig::change(Some(&a), Some(&renewed)).unwrap();
        assert!(what.starts_with("new credentials"), "{what}");
        let what = TlsConfig::change(None, Some(&renewed)).unwrap();
        assert!(what.starts_with("mode off -> require, new credentials"), "{what}");
        assert_eq!(TlsConfig::change(None, None), None);
    }

    /// The expiry's words: the largest unit that keeps two, and the warning's window.
    #[test]
    fn expiry_is_said_in_words() {
        let (d, h) = (86_400, 3_600);
        assert_eq!(span(15 * d + h), "15 days");
        assert_eq!(span(2 * d - 1), "47 hours");
        assert_eq!(span(5 * 60 + 59), "5 minutes");
        assert_eq!(span(1), "1 second");
        assert_eq!(span(0), "0 seconds");
        let cert = TlsConfig::build(TlsMode::Off, TlsFiles::default()).unwrap();
        let at = |end: i64| TlsConfig { cert: Some("c.pem".into()), not_after: Some(end), ..cert.clone() };
        assert_eq!(at(15 * d).expiry_warning(0), None);
        let w = at(14 * d - 1).expiry_warning(0).unwrap();
        assert!(w.starts_with("tls.cert c.pem expires in 13 days"), "{w}");
        let w = at(0).expiry_warning(3 * h).unwrap();
        assert!(w.starts_with("tls.cert c.pem expired 3 hours ago: clients that check"), "{w}");
        assert_eq!(TlsConfig { not_after: None, ..at(0) }.expiry_warning(d), None, "no certificate, no warning");
    }

    #[test]
    fn modes_need_credentials() {
        let e = TlsConfig::build(TlsMode::Require, TlsFiles::default()).unwrap_err();
        assert!(matches!(e, CredentialError::NoServerCredentials), "{e:?}");
        assert!(e.to_string().contains("needs tls.cert and tls.key, or tls.psk_file"), "{e}");
        assert!(TlsConfig::build(TlsMode::Off, TlsFiles::default()).is_ok());
        let files = TlsFiles { cert: Some("c.pem".into()), ..TlsFiles::default() };
        assert_eq!(TlsConfig::build(TlsMode::On, files).unwrap_err().to_string(), "tls.cert needs tls.key");
    }
}
