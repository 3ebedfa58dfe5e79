//! What a daemon is and what its configuration's reloads came to, for `/metrics`.
//!
//! A reload that fails keeps the running configuration and says so once in the log (and in the service
//! manager's `STATUS=`, [`crate::notify`]); a monitoring system should hear of it too, or a mistake in a
//! file is found only at the next restart, when the daemon refuses to start. The series follow
//! Prometheus' own (`prometheus_config_last_reload_successful`), so the usual alert applies:
//! `rein_config_last_reload_successful == 0`.
//!
//! | series | type | meaning |
//! |---|---|---|
//! | `rein_build_info{daemon, version}` | gauge | 1; which daemon and build |
//! | `rein_process_start_time_seconds` | gauge | when the daemon started (Unix time) |
//! | `rein_config_last_reload_successful` | gauge | 1 if the last reload applied (or none was asked), 0 if it was refused |
//! | `rein_config_last_reload_success_timestamp_seconds` | gauge | when the configuration last loaded: the start, or the last reload that applied |
//! | `rein_config_reloads_total{result}` | counter | reloads that applied (`applied`) or were refused (`failed`) |
//! | `rein_config_restart_pending` | gauge | settings the file changes that the last applied reload left for a restart (0: the daemon runs what its file says, as far as a reload can tell) |
//!
//! A reload that applies but leaves settings for a restart (`queue_depth (needs a restart)`) is still a
//! successful reload: `rein_config_restart_pending` is what says the daemon does not run its file as
//! written (it read as successful alone, and the difference stayed unseen until the next restart).
//!
//! A daemon that does not reload shows the first two only (every daemon reloads now; the pShift
//! controller its `[tls]` since 2026-12-05).

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The reloads of one daemon; see the module comment.
#[derive(Debug)]
pub struct Reloads {
    daemon: &'static str,
    started: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    applied: u64,
    failed: u64,
    last_ok: bool,
    last_success: f64,
    restart_pending: usize,
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Reloads {
    /// A daemon (`serve`, `gateway`, `pshift_controller`) whose configuration loaded now.
    pub fn new(daemon: &'static str) -> Reloads {
        Reloads::at(daemon, unix_now())
    }

    fn at(daemon: &'static str, now: f64) -> Reloads {
        Reloads {
            daemon,
            started: now,
            state: Mutex::new(State { applied: 0, failed: 0, last_ok: true, last_success: now, restart_pending: 0 }),
        }
    }

    /// A reload ended: applied (`ok`) or refused, the running configuration kept.
    pub fn record(&self, ok: bool) {
        self.record_at(ok, unix_now());
    }

    /// A reload applied, leaving `restart_pending` settings for a restart.
    pub fn record_applied(&self, restart_pending: usize) {
        self.record_at(true, unix_now());
        self.state.lock().unwrap_or_else(|e| e.into_inner()).restart_pending = restart_pending;
    }

    fn record_at(&self, ok: bool, now: f64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.last_ok = ok;
        if ok {
            s.applied += 1;
            s.last_success = now;
        } else {
            s.failed += 1;
        }
    }

    /// Appends the series of the module comment to `o`; `reloads: false` for a daemon that does not
    /// reload (the build and start series only).
    pub fn metrics(&self, o: &mut String, reloads: bool) {
        use std::fmt::Write;
        let _ = writeln!(
            o,
            "# HELP rein_build_info The daemon and its build.\n# TYPE rein_build_info gauge\n\
             rein_build_info{{daemon=\"{}\",version=\"{}\"}} 1",
            self.daemon,
            env!("CARGO_PKG_VERSION")
        );
        let _ = writeln!(
            o,
            "# HELP rein_process_start_time_seconds When the daemon started, in seconds since the Unix epoch.\n\
             # TYPE rein_process_start_time_seconds gauge\nrein_process_start_time_seconds {}",
            self.started
        );
        if !reloads {
            return;
        }
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            o,
            "# HELP rein_config_last_reload_successful Whether the last reload applied (1; also before any) or \
             was refused (0: the daemon runs an older configuration than its file).\n\
             # TYPE rein_config_last_reload_successful gauge\nrein_config_last_reload_successful {}",
            u8::from(s.last_ok)
        );
        let _ = writeln!(
            o,
            "# HELP rein_config_last_reload_success_timestamp_seconds When the configuration last loaded (the \
             start or a reload that applied), in seconds since the Unix epoch.\n\
             # TYPE rein_config_last_reload_success_timestamp_seconds gauge\n\
             rein_config_last_reload_success_timestamp_seconds {}",
            s.last_success
        );
        let _ = writeln!(
            o,
            "# HELP rein_config_reloads_total Reloads (SIGHUP), by outcome.\n# TYPE rein_config_reloads_total counter\n\
             rein_config_reloads_total{{result=\"applied\"}} {}\nrein_config_reloads_total{{result=\"failed\"}} {}",
            s.applied, s.failed
        );
        let _ = writeln!(
            o,
            "# HELP rein_config_restart_pending Settings the file changes that the last applied reload left for a \
             restart (0: the daemon runs what its file says).\n# TYPE rein_config_restart_pending gauge\n\
             rein_config_restart_pending {}",
            s.restart_pending
        );
    }
}

/// A reload's outcome for the service manager's `STATUS=` ([`crate::notify`]), for every daemon.
pub(crate) fn reloaded_status(applied: usize, needs_restart: usize) -> String {
    format!("configuration reloaded: {applied} changes applied, {needs_restart} need a restart")
}

/// A refused reload for the service manager's `STATUS=` ([`crate::notify`]), for every daemon.
pub(crate) fn reload_failed_status(e: &dyn std::fmt::Display) -> String {
    format!("reload failed, the running configuration is unchanged: {e}")
}

/// Logs a refused reload once and returns its `STATUS=` line (every daemon's).
pub(crate) fn reload_refused(e: &dyn std::fmt::Display) -> String {
    tracing::error!("reload: {e}; the running configuration is unchanged");
    reload_failed_status(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> f64 {
        let line = text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("{series}: {text}"));
        line[series.len()..].trim().parse().unwrap()
    }

    #[test]
    fn a_refused_reload_shows_until_one_applies() {
        let r = Reloads::at("serve", 100.0);
        let text = |r: &Reloads| {
            let mut o = String::new();
            r.metrics(&mut o, true);
            o
        };
        let t = text(&r);
        assert_eq!(value(&t, "rein_config_last_reload_successful "), 1.0, "none asked yet");
        assert_eq!(value(&t, "rein_config_last_reload_success_timestamp_seconds "), 100.0, "the start");
        assert_eq!(value(&t, "rein_process_start_time_seconds "), 100.0);
        assert!(t.contains(&format!("rein_build_info{{daemon=\"serve\",version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))));
        r.record_at(false, 150.0);
        let t = text(&r);
        assert_eq!(value(&t, "rein_config_last_reload_successful "), 0.0);
        assert_eq!(value(&t, "rein_config_last_reload_success_timestamp_seconds "), 100.0, "a refusal loads nothing");
        assert_eq!(value(&t, "rein_config_reloads_total{result=\"failed\"} "), 1.0);
        r.record_at(true, 200.0);
        let t = text(&r);
        assert_eq!(value(&t, "rein_config_last_reload_successful "), 1.0);
        assert_eq!(value(&t, "rein_config_last_reload_success_timestamp_seconds "), 200.0);
        assert_eq!(value(&t, "rein_config_reloads_total{result=\"applied\"} "), 1.0);
        assert_eq!(value(&t, "rein_config_restart_pending "), 0.0);
        // A reload that applies but leaves two settings for a restart is successful, and says what is left.
        r.record_applied(2);
        let t = text(&r);
        assert_eq!(value(&t, "rein_config_last_reload_successful "), 1.0);
        assert_eq!(value(&t, "rein_config_restart_pending "), 2.0);
        r.record(false);
        assert_eq!(value(&text(&r), "rein_config_restart_pending "), 2.0, "a refusal changes nothing that runs");
        r.record_applied(0);
        assert_eq!(value(&text(&r), "rein_config_restart_pending "), 0.0);
        let mut o = String::new();
        r.metrics(&mut o, false);
        assert!(o.contains("rein_build_info") && !o.contains("rein_config_"), "{o}");
    }
}
