//! A small client for `rein serve`'s admin endpoint (what `rein load` and `rein demo` ask it): GET and
//! PUT of JSON over HTTP/1.1 on a fresh connection each (`Connection: close`), with the bearer token
//! (`Authorization: Bearer`) when one is given ([`crate::admin_guard`]), over plain TCP or, for an
//! endpoint served with `admin_tls`, over TLS ([`AdminEndpoint`]: `https://ADDR`, the server's
//! certificate checked against a CA file or the system's roots, and its IP address against the
//! certificate's names).
//!
//! Bounds: a response larger than [`MAX_RESPONSE`] is an error; every call gives up after [`TIMEOUT`].

use crate::admin_guard::AdminToken;
use openssl::ssl::{SslConnector, SslMethod};
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

/// Where the admin endpoint is, and whether it speaks HTTPS (with the TLS client context that checks
/// the server's certificate).
#[derive(Clone)]
pub struct AdminEndpoint {
    /// The endpoint's address.
    pub addr: SocketAddr,
    tls: Option<SslConnector>,
}

impl std::fmt::Debug for AdminEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", if self.tls.is_some() { "https" } else { "http" }, self.addr)
    }
}

impl From<SocketAddr> for AdminEndpoint {
    /// Plain HTTP.
    fn from(addr: SocketAddr) -> AdminEndpoint {
        AdminEndpoint { addr, tls: None }
    }
}

impl AdminEndpoint {
    /// `ADDR` or `http://ADDR` (plain HTTP), or `https://ADDR` (an address, not a host name: the
    /// server's certificate must name that IP). `ca`: the CA certificates (PEM) that the server's
    /// certificate must chain to, for `https://` only; without it, the system's roots. Errors name the
    /// flag (`--admin`, `--admin-ca`).
    pub fn parse(text: &str, ca: Option<&Path>) -> Result<AdminEndpoint, AdminEndpointError> {
        AdminEndpoint::parse_with(text, ca, None)
    }

    /// [`AdminEndpoint::parse`], presenting the client certificate `cert` (PEM, the leaf then any
    /// intermediates) with its `key` when the server asks (an endpoint whose `[tls]` has `ca`). Errors name
    /// `--admin-cert` and `--admin-key`.
    pub fn parse_with(
        text: &str,
        ca: Option<&Path>,
        cert: Option<(&Path, &Path)>,
    ) -> Result<AdminEndpoint, AdminEndpointError> {
        let (https, rest) = match text.split_once("://") {
            None => (false, text),
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            Some((scheme, _)) => {
                return Err(AdminEndpointError::Scheme { text: text.to_string(), scheme: scheme.to_string() })
            }
        };
        let addr: SocketAddr = rest
            .strip_suffix('/')
            .unwrap_or(rest)
            .parse()
            .map_err(|error| AdminEndpointError::Address { text: text.to_string(), error })?;
        if !https {
            if let Some(ca) = ca {
                return Err(AdminEndpointError::NotHttps {
                    flag: "--admin-ca",
                    path: ca.to_path_buf(),
                    text: text.to_string(),
                });
            }
            if let Some((cert, _)) = cert {
                return Err(AdminEndpointError::NotHttps {
                    flag: "--admin-cert",
                    path: cert.to_path_buf(),
                    text: text.to_string(),
                });
            }
            return Ok(addr.into());
        }
        let tls_err = |error| AdminEndpointError::TlsContext { text: text.to_string(), error };
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(tls_err)?;
        if let Some(ca) = ca {
            b.set_ca_file(ca).map_err(|error| AdminEndpointError::CaFile { path: ca.to_path_buf(), error })?;
        }
        if let Some((cert, key)) = cert {
            let _expiry = crate::tls::set_identity(&mut b, crate::tls::Naming::Flags("admin"), cert, key)?;
        }
        Ok(AdminEndpoint { addr, tls: Some(b.build()) })
    }
}

/// Why `--admin` (with `--admin-ca`, `--admin-cert`, `--admin-key`) names no admin endpoint this client
/// can reach; the message names the flag and what it was given.
#[derive(Debug, thiserror::Error)]
pub enum AdminEndpointError {
    /// A scheme other than http or https.
    #[error("--admin {text:?}: unknown scheme {scheme:?}, expected http or https")]
    Scheme {
        /// `--admin` as given.
        text: String,
        /// The scheme.
        scheme: String,
    },
    /// Not an address and port after the scheme (a host name is not resolved).
    #[error("--admin {text:?}: {error} (expected [http[s]://]address:port)")]
    Address {
        /// `--admin` as given.
        text: String,
        /// Why it is not an address.
        #[source]
        error: std::net::AddrParseError,
    },
    /// `--admin-ca` or `--admin-cert` beside a plain-HTTP `--admin`.
    #[error("{flag} {} is for an https:// admin endpoint; --admin is {text:?}", path.display())]
    NotHttps {
        /// `--admin-ca` or `--admin-cert`.
        flag: &'static str,
        /// The file it names.
        path: std::path::PathBuf,
        /// `--admin` as given.
        text: String,
    },
    /// OpenSSL could not make a client context.
    #[error("--admin {text:?}: cannot create the TLS context: {error}")]
    TlsContext {
        /// `--admin` as given.
        text: String,
        /// OpenSSL's reason.
        #[source]
        error: openssl::error::ErrorStack,
    },
    /// `--admin-ca` is not a readable PEM file of CA certificates.
    #[error("--admin-ca {}: not a readable PEM CA file: {error}", path.display())]
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// OpenSSL's reason.
        #[source]
        error: openssl::error::ErrorStack,
    },
    /// `--admin-cert` or `--admin-key` is refused (the message names the flag and the file).
    #[error(transparent)]
    Identity(#[from] crate::tls::CredentialError),
}

/// Largest response read.
pub const MAX_RESPONSE: usize = 16 << 20;
/// Time allowed for a call.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong talking to the admin endpoint.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    /// Connecting, writing or reading failed.
    #[error("admin endpoint {addr}: {source}")]
    Io {
        /// The endpoint.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS handshake failed (the server's certificate not trusted or not for this address, or the
    /// endpoint does not speak TLS).
    #[error("admin endpoint https://{addr}: {message}")]
    Tls {
        /// The endpoint.
        addr: SocketAddr,
        /// OpenSSL's reason.
        message: String,
    },
    /// No answer in time.
    #[error("admin endpoint {0}: no answer within {TIMEOUT:?}")]
    Timeout(SocketAddr),
    /// The answer is not HTTP, too large, or its body not the JSON expected.
    #[error("admin endpoint {addr}: {message}")]
    Bad {
        /// The endpoint.
        addr: SocketAddr,
        /// What is wrong.
        message: String,
    },
    /// The endpoint answered with an error status.
    #[error("admin endpoint {addr}: {path}: HTTP {status}: {body}")]
    Status {
        /// The endpoint.
        addr: SocketAddr,
        /// The resource.
        path: String,
        /// The status code.
        status: u16,
        /// The body (the endpoint's error message).
        body: String,
    },
}

/// `body`, the answer of `endpoint` to `path`, as JSON; an error names the endpoint and the path.
fn json<T: DeserializeOwned>(endpoint: &AdminEndpoint, path: &str, body: &[u8]) -> Result<T, AdminClientError> {
    serde_json::from_slice(body).map_err(|e| AdminClientError::Bad {
        addr: endpoint.addr,
        message: match html_page(body) {
            Some(page) => format!("{path}: {page}, not JSON: {NOT_REIN}"),
            None => format!("{path}: {e}"),
        },
    })
}

/// What an endpoint that answers with an HTML page (a web server or proxy at the address, not a Rein
/// daemon: Rein's admin endpoints answer JSON, and text only for `/metrics`) is asked.
const NOT_REIN: &str = "is this a Rein daemon's admin endpoint (the `admin` address in its configuration)?";

/// `body` summed up as "an HTML page (title \"T\", N bytes)" if it is one (it starts, after white space,
/// with `<!doctype` or `<html`, in any case), or `None`.
fn html_page(body: &[u8]) -> Option<String> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(body.len());
    let head = body[start..].get(..9).unwrap_or(&body[start..]).to_ascii_lowercase();
    if !(head.starts_with(b"<!doctype") || head.starts_with(b"<html")) {
        return None;
    }
    let text = String::from_utf8_lossy(body);
    let lower = text.to_ascii_lowercase();
    let title = lower.find("<title>").and_then(|i| {
        let from = i + "<title>".len();
        lower[from..].find("</title>").map(|n| text[from..from + n].split_whitespace().collect::<Vec<_>>().join(" "))
    });
    Some(match title.filter(|t| !t.is_empty()) {
        Some(t) => format!("an HTML page (title \"{}\", {} bytes)", shown(&t, 100), body.len()),
        None => format!("an HTML page ({} bytes)", body.len()),
    })
}

/// `GET path`, the body parsed as JSON; with `token`, authenticated.
pub async fn get_json<T: DeserializeOwned>(
    endpoint: &AdminEndpoint,
    token: Option<&AdminToken>,
    path: &str,
) -> Result<T, AdminClientError> {
    json(endpoint, path, &call(endpoint, token, "GET", path, None).await?)
}

/// `PUT path` with a JSON body; returns the answer's JSON. With `token`, authenticated.
pub async fn put_json(
    endpoint: &AdminEndpoint,
    token: Option<&AdminToken>,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, AdminClientError> {
    json(endpoint, path, &call(endpoint, token, "PUT", path, Some(body.to_string())).await?)
}

/// `method path` (GET, PUT, POST or DELETE) with an optional JSON body, as `rein admin` sends them;
/// returns the answer's JSON, or `None` for an answer without a body (a DELETE's 204). With `token`,
/// authenticated.
pub async fn send_json(
    endpoint: &AdminEndpoint,
    token: Option<&AdminToken>,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<Option<serde_json::Value>, AdminClientError> {
    let answer = call(endpoint, token, method, path, body.map(|b| b.to_string())).await?;
    if answer.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    json(endpoint, path, &answer).map(Some)
}

/// `GET path`, the body as text (`/metrics`); with `token`, authenticated.
pub async fn get_text(
    endpoint: &AdminEndpoint,
    token: Option<&AdminToken>,
    path: &str,
) -> Result<String, AdminClientError> {
    let body = call(endpoint, token, "GET", path, None).await?;
    String::from_utf8(body)
        .map_err(|_| AdminClientError::Bad { addr: endpoint.addr, message: format!("{path}: not UTF-8") })
}

/// `GET path` from a caller without a runtime of its own (`rein cluster`'s supervisor polls its children
/// from a plain thread): the call runs on a current-thread runtime in a thread of its own, so it works
/// inside or outside a tokio runtime, and gives up after `timeout` (at most [`TIMEOUT`]). Returns the
/// body of a 200 answer.
pub fn get_blocking(endpoint: &AdminEndpoint, path: &str, timeout: Duration) -> Result<Vec<u8>, AdminClientError> {
    let addr = endpoint.addr;
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| AdminClientError::Io { addr, source })?;
            rt.block_on(async {
                tokio::time::timeout(timeout, call(endpoint, None, "GET", path, None))
                    .await
                    .map_err(|_| AdminClientError::Timeout(addr))?
            })
        })
        .join()
        .unwrap_or_else(|_| Err(AdminClientError::Bad { addr, message: "the admin call's thread panicked".into() }))
    })
}

async fn call(
    endpoint: &AdminEndpoint,
    token: Option<&AdminToken>,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<Vec<u8>, AdminClientError> {
    let addr = endpoint.addr;
    let auth = token.map(|t| format!("Authorization: Bearer {}\r\n", t.as_str())).unwrap_or_default();
    let body = body.unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         {auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let io = |source| AdminClientError::Io { addr, source };
    let tls_err = |e: &dyn std::fmt::Display| AdminClientError::Tls { addr, message: e.to_string() };
    let connect = async {
        let tcp = TcpStream::connect(addr).await.map_err(io)?;
        let Some(connector) = &endpoint.tls else { return exchange(addr, tcp, &req).await };
        // The certificate must name the address connected to (an IP SAN).
        let ssl = connector.configure().and_then(|c| c.into_ssl(&addr.ip().to_string())).map_err(|e| tls_err(&e))?;
        let mut tls = SslStream::new(ssl, tcp).map_err(|e| tls_err(&e))?;
        if let Err(e) = Pin::new(&mut tls).connect().await {
            // OpenSSL's "certificate verify failed" says neither why nor what to do.
            let verify = tls.ssl().verify_result();
            if verify != openssl::x509::X509VerifyResult::OK {
                return Err(tls_err(&untrusted(verify.error_string())));
            }
            // A plain HTTP endpoint answers the hello with text, which OpenSSL reads as a record of an
            // unknown version, and says so in its raw form (`error:0A00010B:SSL routines:...`).
            if e.to_string().contains("wrong version number") {
                return Err(tls_err(&NOT_TLS));
            }
            return Err(tls_err(&e));
        }
        exchange(addr, tls, &req).await
    };
    let resp = tokio::time::timeout(TIMEOUT, connect).await.map_err(|_| AdminClientError::Timeout(addr))??;
    let (status, body) = parse_response(&resp).map_err(|m| AdminClientError::Bad { addr, message: m.into() })?;
    if !(200..300).contains(&status) {
        // The endpoint's errors are `{"error": "..."}`: the message, without the JSON around it.
        let said = serde_json::from_slice::<serde_json::Value>(&body).ok();
        let text = match (said.as_ref().and_then(|v| v["error"].as_str()), html_page(&body)) {
            (Some(message), _) => message.to_string(),
            // A web server's or proxy's error page: what it is, not its markup (up to 2,000 characters).
            (None, Some(page)) => format!("{page}: {NOT_REIN}"),
            (None, None) => String::from_utf8_lossy(&body).trim().to_string(),
        };
        // Said on a terminal: neither the endpoint's text nor a name in the path may carry an escape
        // sequence, nor run to megabytes (a proxy's error page, a 414 for a name too long).
        return Err(AdminClientError::Status { addr, path: shown(path, 200), status, body: shown(&text, MAX_SHOWN) });
    }
    Ok(body)
}

/// The most characters of an endpoint's error text that [`AdminClientError::Status`] carries.
pub const MAX_SHOWN: usize = 2000;

/// `text` as it may be shown on a terminal: its control characters (an escape sequence an endpoint
/// sent, say) escaped as Rust writes them (`\u{1b}`), line feeds and tabs kept.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return text.into();
    }
    let mut s = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    s.into()
}

/// [`printable`] `text`, cut to its first `max` characters with what was left out counted.
fn shown(text: &str, max: usize) -> String {
    let text = printable(text);
    match text.char_indices().nth(max) {
        None => text.into_owned(),
        Some((cut, _)) => format!("{}... ({} more bytes)", &text[..cut], text.len() - cut),
    }
}

/// What an `https://` endpoint that answered the TLS hello in plain text is said to be.
const NOT_TLS: &str = "it does not speak TLS (its answer to the TLS hello is no TLS record): a plain HTTP endpoint? \
                       then give its address without https://";

/// A refused server certificate: OpenSSL's reason (`self-signed certificate`, `IP address mismatch`),
/// and the flag that names the CA.
fn untrusted(reason: &str) -> String {
    format!(
        "the server's certificate is not trusted: {reason} (--admin-ca FILE names the CA it must chain to; \
         without it, the system's; it must name the address asked)"
    )
}

/// Sends `req` and reads the whole response (until the server closes), at most [`MAX_RESPONSE`] bytes.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    addr: SocketAddr,
    mut s: S,
    req: &str,
) -> Result<Vec<u8>, AdminClientError> {
    let io = |source| AdminClientError::Io { addr, source };
    s.write_all(req.as_bytes()).await.map_err(io)?;
    let mut resp = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut chunk).await.map_err(io)?;
        if n == 0 {
            break;
        }
        if resp.len() + n > MAX_RESPONSE {
            return Err(AdminClientError::Bad { addr, message: format!("response above {MAX_RESPONSE} bytes") });
        }
        resp.extend_from_slice(&chunk[..n]);
    }
    Ok(resp)
}

/// A whole HTTP response's status and body (de-chunked); `Err` says what is malformed.
/// [`crate::harness::admin_response`] fuzzes it.
pub(crate) fn parse_response(resp: &[u8]) -> Result<(u16, Vec<u8>), &'static str> {
    let bad = |m: &'static str| m;
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("not an HTTP response"))?;
    let head = std::str::from_utf8(&resp[..split]).map_err(|_| bad("response headers are not UTF-8"))?;
    let status: u16 =
        head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| bad("no status in the response"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = resp[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("malformed chunked body"))?;
    }
    Ok((status, body))
}

/// Decodes a chunked transfer encoding.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..line]).ok()?.split(';').next()?.trim(), 16).ok()?;
        b = &b[line + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::{AdminEndpoint, Path, Pin, SslMethod, SslStream};

    /// A server on 127.0.0.1 that reads once from its first connection (a request, a TLS hello), answers
    /// `response` and closes: its address, and the task to wait for.
    async fn answer_once(response: String) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut c, _) = l.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = c.read(&mut request).await;
            let _ = c.write_all(response.as_bytes()).await;
        });
        (addr, server)
    }

    /// `https://` to an endpoint that speaks plain HTTP says so and what to do, not OpenSSL's raw reason
    /// (`error:0A00010B:SSL routines:ssl3_get_record:wrong version number:../ssl/record/ssl3_record.c:350:`).
    #[tokio::test]
    async fn https_to_a_plain_http_endpoint_says_to_drop_https() {
        let (addr, server) =
            answer_once("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into()).await;
        let endpoint = AdminEndpoint::parse(&format!("https://{addr}"), None).unwrap();
        let e = super::get_json::<serde_json::Value>(&endpoint, None, "/api/tenants").await.unwrap_err();
        assert_eq!(e.to_string(), format!("admin endpoint https://{addr}: {}", super::NOT_TLS));
        server.await.unwrap();
    }

    #[test]
    fn endpoints_parse_with_their_scheme() {
        let plain = AdminEndpoint::parse("127.0.0.1:9180", None).unwrap();
        assert_eq!(format!("{plain:?}"), "http://127.0.0.1:9180");
        assert_eq!(
            format!("{:?}", AdminEndpoint::parse("http://127.0.0.1:9180/", None).unwrap()),
            "http://127.0.0.1:9180"
        );
        assert_eq!(format!("{:?}", AdminEndpoint::parse("https://[::1]:9180", None).unwrap()), "https://[::1]:9180");
        let e = AdminEndpoint::parse("ftp://127.0.0.1:1", None).unwrap_err().to_string();
        assert!(e.contains("unknown scheme \"ftp\", expected http or https"), "{e}");
        assert!(AdminEndpoint::parse("https://localhost:9180", None)
            .unwrap_err()
            .to_string()
            .contains("expected [http[s]://]address:port"));
        let ca = std::path::Path::new("ca.pem");
        assert!(AdminEndpoint::parse("127.0.0.1:9180", Some(ca))
            .unwrap_err()
            .to_string()
            .contains("--admin-ca ca.pem is for an https://"));
        let e = AdminEndpoint::parse("https://127.0.0.1:9180", Some(std::path::Path::new("/nonexistent/ca.pem")))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--admin-ca /nonexistent/ca.pem: not a readable PEM CA file"), "{e}");
    }

    /// Each refusal of `--admin` and its companions is its [`super::AdminEndpointError`] variant, carrying
    /// what was given; the messages are those of the `String` error (strings checked against it).
    #[test]
    fn endpoint_refusals_are_typed() {
        use super::AdminEndpointError as E;
        let e = AdminEndpoint::parse("ftp://127.0.0.1:1", None).unwrap_err();
        assert!(matches!(&e, E::Scheme { text, scheme } if text == "ftp://127.0.0.1:1" && scheme == "ftp"), "{e:?}");
        assert_eq!(e.to_string(), "--admin \"ftp://127.0.0.1:1\": unknown scheme \"ftp\", expected http or https");
        let e = AdminEndpoint::parse("https://localhost:9180", None).unwrap_err();
        assert!(matches!(&e, E::Address { text, .. } if text == "https://localhost:9180"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "--admin \"https://localhost:9180\": invalid socket address syntax (expected [http[s]://]address:port)"
        );
        let (ca, cert, key) = (Path::new("ca.pem"), Path::new("c.pem"), Path::new("k.pem"));
        let e = AdminEndpoint::parse("127.0.0.1:9180", Some(ca)).unwrap_err();
        assert!(matches!(&e, E::NotHttps { flag: "--admin-ca", path, .. } if path == ca), "{e:?}");
        assert_eq!(e.to_string(), "--admin-ca ca.pem is for an https:// admin endpoint; --admin is \"127.0.0.1:9180\"");
        let e = AdminEndpoint::parse_with("http://127.0.0.1:9180", None, Some((cert, key))).unwrap_err();
        assert!(matches!(&e, E::NotHttps { flag: "--admin-cert", path, .. } if path == cert), "{e:?}");
        assert_eq!(
            e.to_string(),
            "--admin-cert c.pem is for an https:// admin endpoint; --admin is \"http://127.0.0.1:9180\""
        );
        let missing = Path::new("/nonexistent/ca.pem");
        let e = AdminEndpoint::parse("https://127.0.0.1:9180", Some(missing)).unwrap_err();
        assert!(matches!(&e, E::CaFile { path, .. } if path == missing), "{e:?}");
        let e = AdminEndpoint::parse_with("https://127.0.0.1:9180", None, Some((cert, key))).unwrap_err();
        assert!(matches!(&e, E::Identity(_)), "{e:?}");
        assert_eq!(e.to_string(), "--admin-cert c.pem: No such file or directory (os error 2)");
    }

    /// What an endpoint says is shown without its escape sequences, and a long text cut.
    #[test]
    fn an_endpoints_text_is_shown_without_escapes_and_cut() {
        assert_eq!(super::printable("boom \u{1b}[31mred\u{7}\tx\ny"), "boom \\u{1b}[31mred\\u{7}\tx\ny");
        assert!(matches!(super::printable("plain ü"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(super::shown("abcdef", 4), "abcd... (2 more bytes)");
        assert_eq!(super::shown("abc", 4), "abc");
    }

    /// An HTML page (a web server or proxy at the address, not a Rein daemon) is named as such, with its
    /// title, and the question whether the address is a Rein admin endpoint: as an error status's text
    /// (it was the page's markup, up to 2,000 characters over many lines) and where JSON was expected (it
    /// was serde's "expected value at line 1 column 1"). Rein's own JSON errors and other text are as before.
    #[tokio::test]
    async fn an_html_page_is_named_as_one_not_shown() {
        use super::AdminClientError;
        let page = "\n<!DOCTYPE html>\n<html><head><TITLE>404 Not\n  Found</TITLE></head><body><h1>Not Found</h1>\
                    </body></html>\n";
        assert_eq!(
            super::html_page(page.as_bytes()).unwrap(),
            format!("an HTML page (title \"404 Not Found\", {} bytes)", page.len())
        );
        assert_eq!(super::html_page(b"<HTML><body>x</body></HTML>").unwrap(), "an HTML page (27 bytes)");
        assert_eq!(super::html_page(b"{\"error\": \"<html>\"}"), None);
        assert_eq!(super::html_page(b"<!doc"), None);
        let serve = |status: &'static str, body: &'static str| async move {
            let response =
                format!("HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            AdminEndpoint::parse(&answer_once(response).await.0.to_string(), None).unwrap()
        };
        let e = super::get_text(&serve("404 Not Found", page).await, None, "/api/status").await.unwrap_err();
        assert!(matches!(&e, AdminClientError::Status { status: 404, .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.ends_with(&format!(
                "/api/status: HTTP 404: an HTML page (title \"404 Not Found\", {} bytes): is this a Rein daemon's \
                 admin endpoint (the `admin` address in its configuration)?",
                page.len()
            )),
            "{e}"
        );
        let e = super::get_json::<serde_json::Value>(&serve("200 OK", page).await, None, "/api/status")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("/api/status: an HTML page (title \"404 Not Found\", "), "{e}");
        let not_rein = "is this a Rein daemon's admin endpoint (the `admin` address in its configuration)?";
        assert!(e.ends_with(&format!(", not JSON: {not_rein}")), "{e}");
        let e =
            super::get_text(&serve("500 Internal Server Error", "boom\n").await, None, "/metrics").await.unwrap_err();
        assert!(e.to_string().ends_with("/metrics: HTTP 500: boom"), "{e}");
    }

    /// A server certificate the client does not trust is named as such, with why and the flag that
    /// fixes it (OpenSSL's "certificate verify failed" said neither).
    #[tokio::test]
    async fn an_untrusted_certificate_says_why_and_names_the_ca_flag() {
        use openssl::ssl::{SslAcceptor, SslFiletype};
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        rein_testkit::pki::make_ca(d, "ca", "ca");
        rein_testkit::pki::make_cert(d, "ca", "srv", "srv", &rein_testkit::pki::server("IP:127.0.0.227"));
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
        b.set_certificate_chain_file(d.join("srv-cert.pem")).unwrap();
        b.set_private_key_file(d.join("srv-key.pem"), SslFiletype::PEM).unwrap();
        let acceptor = b.build();
        let l = tokio::net::TcpListener::bind("127.0.0.226:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let ssl = openssl::ssl::Ssl::new(acceptor.context()).unwrap();
                let mut tls = SslStream::new(ssl, tcp).unwrap();
                let _ = Pin::new(&mut tls).accept().await;
            }
        });
        let url = format!("https://{addr}");
        for (ca, why) in [
            (None, "unable to get local issuer certificate"),
            (Some(d.join("ca-cert.pem")), "IP address mismatch"), // the certificate names 127.0.0.227
        ] {
            let endpoint = AdminEndpoint::parse(&url, ca.as_deref()).unwrap();
            let e = super::get_text(&endpoint, None, "/metrics").await.unwrap_err().to_string();
            assert!(e.contains(&format!("the server's certificate is not trusted: {why} (--admin-ca FILE")), "{e}");
        }
    }

    #[test]
    fn dechunks() {
        assert_eq!(super::dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n").unwrap(), b"abcde");
        assert!(super::dechunk(b"5\r\nab").is_none());
    }
}
