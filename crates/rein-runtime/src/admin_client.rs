//! A small client for `rein serve`'s admin endpoint (what `rein load` and `rein demo` ask it): GET and
//! PUT of JSON over HTTP/1.1 on a fresh connection each (`Connection: close`), with the bearer token
//! (`Authorization: Bearer`) when one is given ([`crate::admin_guard`]).
//!
//! Bounds: a response larger than [`MAX_RESPONSE`] is an error; every call gives up after [`TIMEOUT`].

use crate::admin_guard::AdminToken;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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

/// `GET path`, the body parsed as JSON; with `token`, authenticated.
pub async fn get_json<T: DeserializeOwned>(
    addr: SocketAddr,
    token: Option<&AdminToken>,
    path: &str,
) -> Result<T, AdminClientError> {
    let body = call(addr, token, "GET", path, None).await?;
    serde_json::from_slice(&body).map_err(|e| AdminClientError::Bad { addr, message: format!("{path}: {e}") })
}

/// `PUT path` with a JSON body; returns the answer's JSON. With `token`, authenticated.
pub async fn put_json(
    addr: SocketAddr,
    token: Option<&AdminToken>,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, AdminClientError> {
    let answer = call(addr, token, "PUT", path, Some(body.to_string())).await?;
    serde_json::from_slice(&answer).map_err(|e| AdminClientError::Bad { addr, message: format!("{path}: {e}") })
}

async fn call(
    addr: SocketAddr,
    token: Option<&AdminToken>,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<Vec<u8>, AdminClientError> {
    let auth = token.map(|t| format!("Authorization: Bearer {}\r\n", t.as_str())).unwrap_or_default();
    let io = |source| AdminClientError::Io { addr, source };
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.map_err(io)?;
        let body = body.unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
             {auth}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
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
    };
    let resp = tokio::time::timeout(TIMEOUT, exchange).await.map_err(|_| AdminClientError::Timeout(addr))??;
    let (status, body) = parse_response(&resp).map_err(|m| AdminClientError::Bad { addr, message: m.into() })?;
    if status != 200 {
        let text = String::from_utf8_lossy(&body).trim().to_string();
        return Err(AdminClientError::Status { addr, path: path.to_string(), status, body: text });
    }
    Ok(body)
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
    #[test]
    fn dechunks() {
        assert_eq!(super::dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n").unwrap(), b"abcde");
        assert!(super::dechunk(b"5\r\nab").is_none());
    }
}
