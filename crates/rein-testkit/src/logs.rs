//! Log lines captured from `tracing`, for the tests that check what a daemon says ([`Logs`]).

use std::sync::{Arc, Mutex};

/// The lines logged through [`Logs::subscriber`], in plain text (no time, no colour): `" WARN target:
/// message field=value"`. Clones share one buffer, so a test keeps one to read while the subscriber
/// writes through another.
///
/// Install the subscriber for a closure (`tracing::subscriber::with_default(logs.subscriber(), f)`) or
/// for a thread while a guard lives (`let _g = tracing::subscriber::set_default(logs.subscriber())`; in
/// a `#[tokio::test]`, whose runtime runs every task on the test's thread, that covers its tasks).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Empty logs.
    pub fn new() -> Logs {
        Logs::default()
    }

    /// A subscriber that writes every event into these logs.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let to = self.clone();
        tracing_subscriber::fmt().with_writer(move || to.clone()).with_ansi(false).without_time().finish()
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Logs;

    /// An event logged under the subscriber lands in the logs (and in every clone), one outside it
    /// does not.
    #[test]
    fn the_subscriber_writes_into_the_logs() {
        let logs = Logs::new();
        let reader = logs.clone();
        tracing::subscriber::with_default(logs.subscriber(), || tracing::warn!(peer = 7, "a connection refused"));
        tracing::warn!("not captured");
        let text = reader.text();
        assert!(text.starts_with(" WARN") && text.contains("a connection refused peer=7"), "{text}");
        assert!(!text.contains("not captured"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}
