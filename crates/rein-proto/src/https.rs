//! The admin endpoint's HTTPS port (`admin_tls = true`): what the server does with a connection's first
//! byte, before any TLS.
//!
//! A TLS client's first record is a handshake record (content type 22, RFC 8446 section 5.1, the same in
//! TLS 1.0-1.2), so its first byte is [`TLS_HANDSHAKE_RECORD`]. A plain HTTP client's first byte is a
//! method's first letter (`G`, `P`, `D`, ...). OpenSSL would fail the handshake with "wrong version
//! number" and close the connection without a word, which leaves `curl http://...` with "Empty reply
//! from server"; instead the server answers such a client once, in plain HTTP, with
//! [`PLAIN_HTTP_ANSWER`] (400, naming the scheme to use), and closes. Anything else that is not TLS is
//! closed (the same answer is sent; a non-HTTP peer ignores it).

/// The first byte of a TLS handshake record (content type `handshake`).
pub const TLS_HANDSHAKE_RECORD: u8 = 22;

/// The answer to a connection whose first byte is not [`TLS_HANDSHAKE_RECORD`]: a complete HTTP/1.1
/// response that closes the connection.
pub const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\
Content-Length: 64\r\nConnection: close\r\n\r\n\
this admin endpoint serves HTTPS only (admin_tls): use https://\n";

/// Whether a connection that starts with `first_byte` is a TLS client (module comment).
pub fn starts_tls(first_byte: u8) -> bool {
    first_byte == TLS_HANDSHAKE_RECORD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_request_is_told_to_use_https() {
        assert!(starts_tls(0x16));
        for method in [&b"GET"[..], b"PUT", b"POST", b"HEAD", b"DELETE", b"OPTIONS", b"PRI"] {
            assert!(!starts_tls(method[0]));
        }
        // The answer is one well-formed response whose Content-Length is its body's length.
        let text = std::str::from_utf8(PLAIN_HTTP_ANSWER).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head} / {}", body.len());
        assert!(body.contains("use https://"));
    }
}
