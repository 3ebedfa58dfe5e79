//! The run layer of PARDA hosts (parda.txt §3-5; the model is [`crate::model::parda`]).
//!
//! # Model
//! A *host* sits between its VMs (tenants with `host = "..."`) and one server, *the array*. It runs
//! rein-core's [`HostController`] unchanged: VMs' requests queue in its local scheduler (SFQ with optional
//! locality batching, or mClock), and the host releases them to the array while fewer than its window are
//! outstanding. Once per control period each PARDA host publishes a report (its eq. (1) estimate and IO
//! count), reads the others', and updates its window by eq. (2) from the signal:
//! - `aggregation = "cluster"` (§4.2): each host has a rein-core [`Aggregator`] fed from a modelled shared
//!   board: a report becomes visible to the others `aggregation_delay_ms` after its host publishes it
//!   (the shared file's write-then-read latency; 0 = at once), and each host reads the newest visible
//!   report of every other host at its own period tick. Duplicates, staleness and the timeout are the
//!   aggregator's.
//! - `aggregation = "local"` (§4.1): each host uses only its own estimate.
//!
//! Independent hosts do not tick together: host i's first period ends at
//! [`Parda::first_period_end`](rein_model::parda_settings::Parda::first_period_end), with
//! `period_phase = "staggered"` (the default) at `period * (1 + i / hosts)`, the first host first, with
//! `"seed"` at `period * (1 + u_i)`, `u_i` uniform in [0, 1) from the host's own seeded stream.
//! `rein cluster` puts its real hosts' period ends at the same times. Which host ticks first matters when
//! the windows start far from eq. (3)'s (parda-fig2-k4 starts them at 1): it grows first, fills the array
//! ahead of the others and sees the lowest latency at its next tick, so the staggered order favours h1,
//! where a seeded phase favours a different host from seed to seed.
//! An *uncontrolled* host (`controlled = false`, or `[parda] enabled = false` for all) keeps a fixed
//! issue queue (`window`, default `w_max`; `window_schedule` resizes it during the run, as in §5.2's
//! two-phase runs) and does not publish: an external host (§5.3.4) or the no-PARDA baseline.
//!
//! The array is any server; for PARDA scenarios a `fifo` scheduler with a deep `queue_depth` so every
//! issued IO is at the device and latency grows with the array's queue (Little's law). Each host may have
//! a `service_scale`: a multiplier on its requests' service times at the array (placement skew, §4.1).
//! With `discipline = "ps"` (processor sharing) a host's latency follows its own service demand, which is
//! how placement made the paper's hosts see different latencies.
//!
//! # Measured
//! Per host per interval (rein-model's [`HostRecorder`]): completions and their latency (issue at the host
//! to completion, the device latency PARDA sees; the tenants' own latencies also include the time queued
//! at the host), and at each period's end the window, beta, signal and own estimate.

use super::SetupError;
use crate::model::parda::Aggregation;
use crate::model::Scenario;
use rein_core::parda::{Aggregator, HostConfig, HostController, HostReport};
use rein_core::{Nanos, Poll, Request, SchedConfig, TenantId};
use rein_model::recorder::MAX_CELLS;
use rein_model::report::hosts::HostRecorder;
use std::collections::VecDeque;

struct HostRt {
    ctl: HostController,
    agg: Aggregator,
    /// Runs PARDA (publishes and updates its window).
    parda: bool,
    wake_at: Option<u64>,
}

/// The hosts of a running simulation (owned by the engine).
pub(crate) struct HostLayer {
    aggregation: Aggregation,
    delay: Nanos,
    hosts: Vec<HostRt>,
    /// Per tenant: (host, the VM's id in the host's scheduler).
    vm: Vec<Option<(u32, TenantId)>>,
    /// Per tenant: service-time multiplier at the array.
    scale: Vec<f64>,
    /// Published reports per host, oldest first: (visible from, report).
    board: Vec<VecDeque<(Nanos, HostReport)>>,
    rec: HostRecorder,
}

impl HostLayer {
    pub(crate) fn new(sc: &Scenario) -> Result<Option<HostLayer>, SetupError> {
        let Some(p) = &sc.parda else { return Ok(None) };
        // Validation refuses a file whose hosts exceed the bound (`model::check_timeseries`); this holds a
        // scenario changed since (its fields are public) to it too, at no cost: the recorder checks anyway.
        let intervals = rein_model::recorder::intervals(sc.duration, sc.interval);
        let rec =
            HostRecorder::new(sc.hosts.len(), sc.interval, intervals, MAX_CELLS).map_err(SetupError::HostSeries)?;
        let mut layer = HostLayer {
            aggregation: p.aggregation,
            delay: p.delay,
            hosts: Vec::with_capacity(sc.hosts.len()),
            vm: vec![None; sc.tenants.len()],
            scale: vec![1.0; sc.tenants.len()],
            board: vec![VecDeque::new(); sc.hosts.len()],
            rec,
        };
        for (i, h) in sc.hosts.iter().enumerate() {
            let runs = h.runs_parda(p);
            let sched = SchedConfig { batch: p.batch, batch_distance: p.batch_distance, ..sc.sched };
            let hc = HostConfig {
                id: i as u32,
                epoch: 1,
                beta: h.beta,
                beta_per_share: p.beta_per_share,
                scheduler: p.local_scheduler,
                sched,
                fixed_window: if runs { None } else { Some(h.window.unwrap_or(p.config.w_max)) },
            };
            let mut ctl = HostController::new(p.config, hc, Nanos::ZERO)
                .map_err(|error| SetupError::Host { host: h.name.clone(), error })?;
            ctl.set_period_end(Nanos::ZERO, p.first_period_end(sc.seed(), i, sc.hosts.len()))
                .expect("the first period ends within two periods");
            for &t in &h.vms {
                let id = ctl.add_vm(sc.tenants[t].spec).map_err(|error| SetupError::Vm {
                    host: h.name.clone(),
                    vm: sc.tenants[t].name.clone(),
                    error,
                })?;
                layer.vm[t] = Some((i as u32, id));
                layer.scale[t] = h.service_scale;
            }
            let agg = Aggregator::new(p.timeout).map_err(SetupError::Aggregator)?;
            layer.hosts.push(HostRt { ctl, agg, parda: runs, wake_at: None });
            layer.record(i, Nanos::ZERO, None);
        }
        Ok(Some(layer))
    }

    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }

    /// When host `h`'s first period ends.
    pub(crate) fn first_period(&self, h: usize) -> Nanos {
        self.hosts[h].ctl.poll_timeout()
    }

    /// The host of tenant `t`, if it is a VM.
    #[inline]
    pub(crate) fn host_of(&self, t: usize) -> Option<usize> {
        self.vm[t].map(|(h, _)| h as usize)
    }

    /// Service-time multiplier of tenant `t`'s requests at the array.
    #[inline]
    pub(crate) fn scale(&self, t: usize) -> f64 {
        self.scale[t]
    }

    /// Uncontrolled host `h`'s issue queue becomes `window` IOs (a `window_schedule` step).
    pub(crate) fn set_fixed_window(&mut self, h: usize, now: Nanos, window: f64) {
        self.hosts[h]
            .ctl
            .set_fixed_window(now, window)
            .expect("model::parda allows window_schedule only on hosts with a fixed window in [1, MAX_WINDOW]");
        self.record(h, now, None);
    }

    /// A VM's request reaches its host. False if the host's queue is full (the request is rejected).
    pub(crate) fn enqueue(&mut self, now: Nanos, t: usize, handle: u64, size: u64, offset: u64) -> bool {
        let (h, id) = self.vm[t].expect("tenant is a VM");
        let req = Request::new(id, handle).size(size).offset(offset);
        self.hosts[h as usize].ctl.enqueue(now, req).is_ok()
    }

    pub(crate) fn poll(&mut self, h: usize, now: Nanos) -> Poll {
        self.hosts[h].ctl.poll(now)
    }

    pub(crate) fn wake_at(&mut self, h: usize) -> &mut Option<u64> {
        &mut self.hosts[h].wake_at
    }

    /// A request of VM `t` issued by its host at `issued` completed (reached the host) at `now`.
    pub(crate) fn complete(&mut self, now: Nanos, t: usize, issued: Nanos, size: u64) {
        let (h, id) = self.vm[t].expect("tenant is a VM");
        let lat = now.saturating_sub(issued);
        self.hosts[h as usize]
            .ctl
            .on_complete(now, id, lat, size)
            .expect("the engine completes only what the host issued");
        self.rec.completion(h as usize, now, lat);
    }

    /// A request of VM `t` that its host released was refused by the array (full scheduler queue).
    pub(crate) fn failed(&mut self, now: Nanos, t: usize) {
        let (h, id) = self.vm[t].expect("tenant is a VM");
        self.hosts[h as usize].ctl.on_issue_failed(now, id).expect("the engine fails only what the host issued");
    }

    fn record(&mut self, h: usize, now: Nanos, signal: Option<f64>) {
        let st = self.hosts[h].ctl.stats();
        self.rec.period(h, now, st.window, st.beta, signal.unwrap_or(0.0), st.estimate_ns.unwrap_or(0.0));
    }

    /// Host `h`'s period ends at `now`: publish, aggregate, update. Returns when the next one ends.
    pub(crate) fn period(&mut self, h: usize, now: Nanos) -> Nanos {
        let signal = if self.hosts[h].parda {
            let own = self.hosts[h].ctl.close_period(now);
            match self.aggregation {
                Aggregation::Local => self.hosts[h].ctl.local_estimate_ns(),
                Aggregation::Cluster => {
                    self.board[h].push_back((now.saturating_add(self.delay), own));
                    let HostRt { agg, .. } = &mut self.hosts[h];
                    agg.accept(now, own).expect("host ids are below MAX_HOSTS");
                    for (g, board) in self.board.iter_mut().enumerate() {
                        // Reports superseded by a newer visible one are never read again.
                        while board.len() >= 2 && board[1].0 <= now {
                            board.pop_front();
                        }
                        if g == h {
                            continue;
                        }
                        if let Some(&(at, r)) = board.front() {
                            if at <= now {
                                agg.accept(now, r).expect("host ids are below MAX_HOSTS");
                            }
                        }
                    }
                    agg.cluster(now).map(|c| c.latency_ns)
                }
            }
        } else {
            None
        };
        self.hosts[h].ctl.on_period(now, signal);
        self.record(h, now, signal);
        self.hosts[h].ctl.poll_timeout()
    }

    /// The hosts' recording, for the report.
    pub(crate) fn finish(self) -> HostRecorder {
        self.rec
    }
}
