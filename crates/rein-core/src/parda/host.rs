//! One PARDA host: the local scheduler that divides the window among VMs (§3.3), eq. (1)'s estimator,
//! eq. (2)'s window, and eq. (4)'s beta, as one sans-IO state machine.
//!
//! The local scheduler is any [`Scheduler`] (PARDA uses SFQ with bounded batching of nearby requests,
//! §3.3: [`SchedulerKind::Sfq`] with [`SchedConfig::batch`] / [`SchedConfig::batch_distance`]; with
//! [`SchedulerKind::Mclock`] the VMs can also have reservations and limits inside the host's share).
//! The VMs are its tenants and their [`QosSpec`] weights are their shares s_i.
//!
//! The host releases requests to the array while `outstanding < issue limit` (invariant 3 of `parda`);
//! a completion frees a slot. Once per period ([`HostController::poll_timeout`]) the caller calls
//! [`HostController::close_period`] (eq. (1) folds in the period's latencies; the report to publish comes
//! back), obtains the latency signal (the host's own [`HostController::local_estimate_ns`], or the cluster
//! average from an [`super::Aggregator`] fed with everyone's reports) and calls
//! [`HostController::on_period`] (eq. (4), then eq. (2)).

use super::{
    HostReport, LatencyEstimator, PardaConfig, PardaError, ShareTracker, VmUsage, WindowController, MAX_BETA,
    MAX_HOSTS, MAX_VMS_PER_HOST, MAX_WINDOW,
};
use crate::sched::{Poll, Request, SchedConfig, Scheduler, SchedulerKind, TenantId};
use crate::spec::QosSpec;
use crate::units::{LatestTime, Nanos};

/// Per-host parameters.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct HostConfig {
    /// The host's id in reports (below [`MAX_HOSTS`]).
    pub id: u32,
    /// Incarnation number carried in reports: a host that restarts picks a different one, so peers accept
    /// its sequence numbers from the start again.
    pub epoch: u64,
    /// beta before eq. (4)'s scaling. `None`: `beta_per_share` times the sum of the VMs' shares.
    pub beta: Option<f64>,
    /// K of §3.4 (`beta = K * sum s_i`); used when `beta` is `None`.
    pub beta_per_share: f64,
    /// The local scheduler among the host's VMs.
    pub scheduler: SchedulerKind,
    /// The local scheduler's configuration (cost model, batching, bounds).
    pub sched: SchedConfig,
    /// An uncontrolled host: a fixed issue queue of this many IOs, never updated.
    pub fixed_window: Option<f64>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            id: 0,
            epoch: 0,
            beta: None,
            beta_per_share: 1.0,
            scheduler: SchedulerKind::Sfq,
            sched: SchedConfig::default(),
            fixed_window: None,
        }
    }
}

impl HostConfig {
    /// Checks the id, beta, K and the fixed window; returns the first problem found.
    pub fn validate(&self) -> Result<(), PardaError> {
        if self.id >= MAX_HOSTS {
            return Err(PardaError::HostId { id: self.id, max: MAX_HOSTS });
        }
        if let Some(b) = self.beta {
            if !(b.is_finite() && b > 0.0 && b <= MAX_BETA) {
                return Err(PardaError::Beta { value: b, max: MAX_BETA });
            }
        }
        if !(self.beta_per_share.is_finite() && self.beta_per_share > 0.0) {
            return Err(PardaError::BetaPerShare(self.beta_per_share));
        }
        if let Some(w) = self.fixed_window {
            check_fixed_window(w)?;
        }
        Ok(())
    }
}

/// A fixed issue-queue window must be a finite number in `1..=MAX_WINDOW`.
pub fn check_fixed_window(window: f64) -> Result<(), PardaError> {
    if window.is_finite() && (1.0..=MAX_WINDOW).contains(&window) {
        Ok(())
    } else {
        Err(PardaError::FixedWindow { value: window, max: MAX_WINDOW })
    }
}

/// What one period's update decided.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PeriodOutcome {
    /// w(t+1).
    pub window: f64,
    /// beta used in the update (after eq. (4)).
    pub beta: f64,
    /// The latency signal used (ns), if any.
    pub signal_ns: Option<f64>,
    /// IOs completed in the period that ended.
    pub ios: u64,
}

/// A snapshot of a host's state.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct HostStats {
    /// w(t), IOs (fractional).
    pub window: f64,
    /// IOs the host may have outstanding now: `floor(w)` or `floor(w) + 1` (invariant 2).
    pub issue_limit: u32,
    /// beta in use (after eq. (4) at the last period's end).
    pub beta: f64,
    /// beta before eq. (4).
    pub beta_base: f64,
    /// IOs issued to the array and not completed.
    pub outstanding: u32,
    /// IOs waiting in the local scheduler.
    pub queued: usize,
    /// The host's own eq. (1) estimate (ns).
    pub estimate_ns: Option<f64>,
    /// Control periods ended ([`HostController::on_period`] calls).
    pub periods: u64,
    /// IOs completed since the host started.
    pub completed: u64,
}

/// One host; see the module comment.
pub struct HostController {
    config: PardaConfig,
    host: HostConfig,
    sched: Box<dyn Scheduler>,
    estimator: LatencyEstimator,
    window: WindowController,
    shares: ShareTracker,
    /// The VM id at each scheduler slot (so a completion of a removed VM is not charged to a newcomer).
    vms: Vec<Option<TenantId>>,
    vm_count: usize,
    beta: f64,
    outstanding: u32,
    /// Invariant 5: time never goes backwards.
    time: LatestTime,
    /// When the current period ends ([`HostController::poll_timeout`]).
    period_end: Nanos,
    period_ios: u64,
    periods: u64,
    completed: u64,
    seq: u64,
    /// The report of the period in progress once `close_period` made it.
    closed: Option<HostReport>,
    usage: Vec<(TenantId, VmUsage)>,
}

impl std::fmt::Debug for HostController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostController").field("host", &self.host).field("stats", &self.stats()).finish()
    }
}

impl HostController {
    /// A host starting its first period at `now`.
    pub fn new(config: PardaConfig, host: HostConfig, now: Nanos) -> Result<Self, PardaError> {
        config.validate()?;
        host.validate()?;
        let window = match host.fixed_window {
            Some(w) => WindowController::fixed(w),
            None => WindowController::new(&config),
        };
        let mut h = HostController {
            config,
            host,
            sched: host.scheduler.build(host.sched),
            estimator: LatencyEstimator::new(config.alpha, config.size_model),
            window,
            shares: ShareTracker::new(now),
            vms: Vec::new(),
            vm_count: 0,
            beta: 0.0,
            outstanding: 0,
            time: LatestTime::starting_at(now),
            period_end: now.saturating_add(config.period),
            period_ios: 0,
            periods: 0,
            completed: 0,
            seq: 0,
            closed: None,
            usage: Vec::new(),
        };
        h.beta = h.beta_base();
        Ok(h)
    }

    /// beta before eq. (4): the configured beta, or K times the sum of the VMs' shares.
    pub fn beta_base(&self) -> f64 {
        self.host.beta.unwrap_or_else(|| self.host.beta_per_share * self.shares.total_share())
    }

    /// The beta in use (after eq. (4) at the last period's end).
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// The cluster-wide PARDA parameters the host runs with.
    pub fn config(&self) -> &PardaConfig {
        &self.config
    }

    /// The host's own parameters.
    pub fn host_config(&self) -> &HostConfig {
        &self.host
    }

    /// Adds a VM whose share is `spec.weight()` (and, with mClock, reservation and limit).
    pub fn add_vm(&mut self, spec: QosSpec) -> Result<TenantId, PardaError> {
        if self.vm_count >= MAX_VMS_PER_HOST {
            return Err(PardaError::TooManyVms { max: MAX_VMS_PER_HOST });
        }
        let id = self.sched.add_tenant(spec)?;
        if self.vms.len() <= id.index() {
            self.vms.resize(id.index() + 1, None);
        }
        self.vms[id.index()] = Some(id);
        self.vm_count += 1;
        self.shares.add(self.time.now(), id.index(), spec.weight());
        if self.periods == 0 {
            self.beta = self.beta_base();
        }
        Ok(id)
    }

    /// Changes a VM's spec (its share takes effect in beta from the next period).
    pub fn set_vm_spec(&mut self, id: TenantId, spec: QosSpec) -> Result<(), PardaError> {
        self.sched.set_spec(id, spec)?;
        self.shares.set_share(id.index(), spec.weight());
        Ok(())
    }

    /// Replaces the local scheduler's settings (a reload): queued requests stay; the new rules apply from
    /// the next tags computed ([`Scheduler::set_config`]).
    pub fn set_sched_config(&mut self, config: SchedConfig) {
        self.sched.set_config(config);
    }

    /// Removes a VM; returns the handles it still had queued at the host (its IOs at the array still
    /// complete through [`HostController::on_complete`]).
    pub fn remove_vm(&mut self, id: TenantId) -> Result<Vec<u64>, PardaError> {
        let handles = self.sched.remove_tenant(id)?;
        self.vms[id.index()] = None;
        self.vm_count -= 1;
        self.shares.remove(id.index());
        Ok(handles)
    }

    /// A VM's IO arrives at the host.
    pub fn enqueue(&mut self, now: Nanos, req: Request) -> Result<(), PardaError> {
        let now = self.time.advance(now);
        self.sched.enqueue(now, req)?;
        self.shares.arrived(now, req.tenant.index());
        Ok(())
    }

    /// The next IO to issue to the array, if the window allows one (invariant 3). [`Poll::Empty`] means
    /// nothing may go now: the local queue is empty or the window is full; poll again after a completion
    /// or an arrival. [`Poll::Wait`] comes from the local scheduler (mClock limits).
    pub fn poll(&mut self, now: Nanos) -> Poll {
        let now = self.time.advance(now);
        if self.outstanding >= self.window.issue_limit() {
            return Poll::Empty;
        }
        let p = self.sched.poll(now, self.outstanding == 0);
        if let Poll::Dispatch(_) = p {
            self.outstanding += 1;
            debug_assert!(self.outstanding <= self.window.issue_limit(), "invariant 3");
        }
        p
    }

    /// An uncontrolled host's issue queue changes to `window` IOs at `now` (an administrator resizing
    /// it, as in parda.txt §5.2's two-phase runs). IOs already issued stay outstanding; a smaller window
    /// issues nothing until enough complete. Errors: the host runs PARDA ([`PardaError::NotFixed`]) or
    /// `window` is outside [1, [`MAX_WINDOW`]] ([`PardaError::FixedWindow`]).
    pub fn set_fixed_window(&mut self, now: Nanos, window: f64) -> Result<(), PardaError> {
        self.time.advance(now);
        if !self.window.is_fixed() {
            return Err(PardaError::NotFixed);
        }
        check_fixed_window(window)?;
        self.window = WindowController::fixed(window);
        self.host.fixed_window = Some(window);
        Ok(())
    }

    /// Whether the window is what holds requests back now.
    pub fn window_full(&self) -> bool {
        self.outstanding >= self.window.issue_limit()
    }

    /// An IO of `vm` issued by this host completed after `latency` (issue to completion).
    pub fn on_complete(&mut self, now: Nanos, vm: TenantId, latency: Nanos, size: u64) -> Result<(), PardaError> {
        self.release_slot(now, vm)?;
        self.estimator.observe(latency, size);
        self.period_ios += 1;
        self.completed += 1;
        Ok(())
    }

    /// An IO the host issued left the array without a latency to learn from (refused, or answered
    /// while the caller's process was stopped, so that its latency would hold the stop): frees its slot
    /// without touching the estimate.
    pub fn on_issue_failed(&mut self, now: Nanos, vm: TenantId) -> Result<(), PardaError> {
        self.release_slot(now, vm)
    }

    /// An issued IO of `vm` left the array (completed or failed): frees its window slot.
    fn release_slot(&mut self, now: Nanos, vm: TenantId) -> Result<(), PardaError> {
        let now = self.time.advance(now);
        if self.outstanding == 0 {
            return Err(PardaError::UnexpectedCompletion);
        }
        self.outstanding -= 1;
        if self.vms.get(vm.index()).copied().flatten() == Some(vm) {
            self.shares.departed(now, vm.index());
        }
        self.window.on_slot_freed();
        Ok(())
    }

    /// An IO the host had queued was dropped before issue (e.g. the caller failed it): keeps eq. (4)'s
    /// outstanding counts right.
    pub fn on_dropped(&mut self, now: Nanos, vm: TenantId) {
        let now = self.time.advance(now);
        if self.vms.get(vm.index()).copied().flatten() == Some(vm) {
            self.shares.departed(now, vm.index());
        }
    }

    /// When the current period ends: call [`HostController::on_period`] at or after this time.
    pub fn poll_timeout(&self) -> Nanos {
        self.period_end
    }

    /// The current period ends at `end` instead of one period after it began; the next ones follow it
    /// a period apart. The IOs of the period so far stay in it. This is how hosts started at different
    /// moments put their periods where a run wants them (`rein cluster` gives each host the simulator's
    /// phase; an operator may line hosts up). Errors: `end` before `now`, or more than two periods after
    /// it ([`PardaError::PeriodEnd`]).
    pub fn set_period_end(&mut self, now: Nanos, end: Nanos) -> Result<(), PardaError> {
        let now = self.time.advance(now);
        let max_ns = self.config.period.0.saturating_mul(2);
        if end < now || end.0 - now.0 > max_ns {
            return Err(PardaError::PeriodEnd { ahead_ns: end.0 as i128 - now.0 as i128, max_ns });
        }
        self.period_end = end;
        Ok(())
    }

    /// Ends the measurement part of the period: eq. (1) folds in the period's mean latency; returns the
    /// report to publish (the new estimate, the period's IO count, a new sequence number). Calling it
    /// again before [`HostController::on_period`] returns the same report.
    pub fn close_period(&mut self, now: Nanos) -> HostReport {
        let now = self.time.advance(now);
        if let Some(r) = self.closed {
            return r;
        }
        let estimate = self.estimator.close_period();
        self.seq += 1;
        let r = HostReport {
            host: self.host.id,
            epoch: self.host.epoch,
            seq: self.seq,
            timestamp: now,
            latency_ns: estimate.map_or(0, |l| l.round().min(u64::MAX as f64) as u64),
            ios: self.period_ios,
        };
        self.closed = Some(r);
        r
    }

    /// The host's own eq. (1) estimate as of the last period's end: the signal for local-only control
    /// (§4.1).
    pub fn local_estimate_ns(&self) -> Option<f64> {
        self.estimator.estimate_ns()
    }

    /// Ends the period (closing it first if [`HostController::close_period`] was not called): beta by
    /// eq. (4) from the period's usage, then the window by eq. (2) with the latency signal `signal_ns`
    /// (the cluster average, or the host's own estimate; `None`: no IO anywhere, the window is held).
    pub fn on_period(&mut self, now: Nanos, signal_ns: Option<f64>) -> PeriodOutcome {
        self.close_period(now);
        self.closed = None;
        let now = self.time.advance(now);
        let base = self.beta_base();
        let (beta, usage) = self.shares.end_period(now, self.window.window(), base, self.config.adjust_beta);
        self.usage.clear();
        self.usage
            .extend(usage.into_iter().filter_map(|(slot, u)| self.vms.get(slot).copied().flatten().map(|id| (id, u))));
        self.beta = beta;
        let window = self.window.update(signal_ns, beta);
        let ios = self.period_ios;
        self.period_ios = 0;
        self.period_end = now.saturating_add(self.config.period);
        self.periods += 1;
        PeriodOutcome { window, beta, signal_ns, ios }
    }

    /// Each VM's eq. (4) accounting for the last period.
    pub fn vm_usage(&self) -> &[(TenantId, VmUsage)] {
        &self.usage
    }

    /// The local scheduler (per-VM statistics and specs).
    pub fn scheduler(&self) -> &dyn Scheduler {
        self.sched.as_ref()
    }

    /// A snapshot of the window, beta, queues and counters.
    pub fn stats(&self) -> HostStats {
        HostStats {
            window: self.window.window(),
            issue_limit: self.window.issue_limit(),
            beta: self.beta,
            beta_base: self.beta_base(),
            outstanding: self.outstanding,
            queued: self.sched.queued(),
            estimate_ns: self.estimator.estimate_ns(),
            periods: self.periods,
            completed: self.completed,
        }
    }

    /// How many times `now` went backwards (and was clamped).
    pub fn time_regressions(&self) -> u64 {
        self.time.regressions() + self.sched.time_regressions()
    }
}
