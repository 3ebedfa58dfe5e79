//! # rein-cluster: a simulator scenario on real daemons
//!
//! `rein cluster up` and `rein cluster run` start the processes a scenario describes and drive its
//! workloads through them, so the same file runs in the simulator and on real daemons and the two compare.
//!
//! # Model
//! One code path decides what a scenario means for both: the file is read and validated by rein-sim's
//! own loader into the [`Scenario`] `rein sim` runs; [`plan`] derives each process's configuration from
//! that value (never from the TOML); [`supervisor`] starts, watches and stops the processes; [`drive`]
//! runs every tenant's workload (rein-model's generator, the simulator's own) through its endpoint with
//! rein-runtime's load driver, for the scenario's duration in real time, into the same
//! [`rein_model::RunTotals`] the simulator produces, so rein-sim's check layer applies to it unchanged.
//!
//! # Invariants
//! 1. A scenario feature a real cluster cannot run is refused before anything starts, by name.
//! 2. Every child is stopped and reaped, also when a child dies, the run fails or the caller panics
//!    ([`supervisor`]'s invariants).
//! 3. The driver's tenants are the scenario's, in its order and with its specs, so `[[expect]]` entries
//!    index them as in the simulator.
//!
//! # Symbol map
//! | simulator | cluster |
//! |---|---|
//! | `[[servers]]` entry | a `rein serve` node ([`plan::NodePlan`]) |
//! | gateway of a tenant over several servers (dmClock tracker) | a `rein gateway` ([`plan::GatewayPlan`]) |
//! | tenant's generator | [`drive`]: rein-runtime's load driver, one job per tenant |
//! | completion phases | the nodes' `/api/tenants` counters, summed over the tenant's nodes |
//! | PARDA host (`[[hosts]]`) | a `rein gateway` with `[parda]`; its `/api/parda`, read each interval |
//! | pShift controller, bucket (`[pshift]`) | `rein pshift controller` (started with the load); a job with a window on each of the bucket's nodes, moving with its demand phases |
//!
//! # Deviations
//! Time is real: results vary from run to run (service-time draws, scheduling of the processes on a
//! shared machine), where the simulator's are a function of the seed. See [`plan`] for routing.

#![forbid(unsafe_code)]

pub mod plan;
pub mod supervisor;

pub use plan::{Endpoint, Plan, PlanError};
pub use supervisor::{ChildDied, ClusterError, LogFile, RunDir, Supervisor};

use rein_runtime::load::{Job, JobRoute, Live, LoadConfig, LoadError, Outcome};
use rein_sim::Scenario;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// NBD connections a tenant's load opens to its endpoint at least (more where the tenant can have more
/// requests outstanding than they hold: [`plan::load_connections`]). One: the simulator's tenant is one
/// ordered stream of requests, and a server reads each connection in its own task, so requests spread
/// over several reach the scheduler reordered. On a position-dependent disk model each access out of order
/// can pay a seek: mclock-table5-batch's vm2 got 0.979x and 0.982x of the simulator's IOPS with one
/// connection, 0.965x and 0.974x with four (2026-12-02, alternating runs).
pub const CONNECTIONS_PER_TENANT: usize = 1;

/// How long after the load's end `rein cluster run` waits for the pShift controller to close the QoS
/// period that ends with the run (its boundary's round needs every node's report, or the report timeout).
pub const PERIOD_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A gateway volume's layout, as the load driver uses it.
#[derive(Debug)]
struct Volume {
    stripe: rein_model::stripe::Stripe,
    size: u64,
}

impl rein_runtime::load::Layout for Volume {
    fn aim(&self, k: usize, offset: u64, len: u64) -> u64 {
        plan::aim(&self.stripe, k, offset, len, self.size)
    }

    fn window_of(&self, offset: u64) -> usize {
        self.stripe.locate(offset).0
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The load could not run.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A child exited during the run.
    #[error(transparent)]
    Died(#[from] ChildDied),
    /// The pShift controller could not be driven (the message says what failed).
    #[error("{0}")]
    Controller(String),
}

/// The load jobs for `sc` on `plan`: one per tenant, in scenario order, with the tenant's spec and its
/// nodes' admin endpoints (phases).
pub fn jobs(sc: &Scenario, plan: &Plan) -> Vec<Job> {
    sc.tenants()
        .iter()
        .zip(&plan.endpoints)
        .map(|(t, e)| Job {
            name: t.name.clone(),
            export: e.export.clone(),
            tenant: t.name.clone(),
            // A direct endpoint (a pShift bucket) opens its connections to each of its servers, where its
            // per-server window is all it has in flight (an open one: room for its whole backlog there).
            connections: if e.direct.is_empty() {
                plan::load_connections(t, sc.duration(), CONNECTIONS_PER_TENANT)
            } else if e.arrivals.is_some() {
                plan::load_connections(t, sc.duration(), 1)
            } else {
                let window = match t.workload.kind {
                    rein_model::workload::WorkloadKind::Closed { outstanding, .. } => outstanding as usize,
                    _ => 1,
                };
                window.div_ceil(rein_runtime::nbd::MAX_IN_FLIGHT_PER_CONN).max(1)
            },
            workload: t.workload.clone(),
            route: Some(JobRoute {
                addr: e.nbd,
                spec: Some(t.spec),
                admins: e.node_admins.iter().map(|&a| a.into()).collect(),
                servers: e.servers.clone(),
                // Through a gateway: window k's offsets in node k's stripes; completions at their node.
                layout: e
                    .stripe
                    .clone()
                    .map(|(stripe, size)| Arc::new(Volume { stripe, size }) as Arc<dyn rein_runtime::load::Layout>),
                window_addrs: e.direct.clone(),
                phases: e.phases.clone(),
                arrivals: e.arrivals,
                devices: matches!(t.routing, rein_model::routing::Routing::Device(_))
                    .then(|| rein_model::routing::Router::new(&t.routing, t.servers.len())),
            }),
            stream: Some(t.stream),
        })
        .collect()
}

/// Runs `sc`'s workloads through `plan`'s endpoints for the scenario's duration, watching `sup`'s
/// children: a child that exits ends the run with [`RunError::Died`]. `live` gets each interval's rows.
/// Requests that failed do not end the run: the outcome's `failures` says them beside the totals.
pub async fn drive(
    sc: &Scenario,
    plan: &Plan,
    sup: Arc<Mutex<Supervisor>>,
    live: impl FnMut(Duration, &Live) + Send,
) -> Result<Outcome, RunError> {
    let addr = plan.endpoints.first().map(|e| e.nbd).unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    let cfg = LoadConfig {
        warmup: Duration::from_nanos(sc.warmup().0),
        interval: Duration::from_nanos(sc.interval().0),
        seed: sc.seed(),
        name: sc.name().to_string(),
        servers: sc.servers().iter().map(|s| s.name.clone()).collect(),
        // Node i is server i: its device's busy time gives the server's utilisation.
        server_admins: plan.nodes.iter().map(|n| n.admin.into()).collect(),
        // The nodes run the scenario's [mclock] table (plan::mclock_table), its cost model included.
        cost_model: sc.sched().cost_model,
        start_gate: plan.controller.as_ref().map(|_| rein_runtime::load::StartGate::default()),
        // A scenario run in parts joins their reports, which must have one duration.
        report_early_end: false,
        ..LoadConfig::new(addr, jobs(sc, plan), Duration::from_nanos(sc.duration().0))
    };
    // A pShift controller's schedule starts with the load (`hold = true`), so its QoS periods are the
    // report's: once every connection is open, the start request goes out, and the load's time starts
    // when it is answered (the schedule's origin is then about half a loopback round trip earlier: the
    // IOs before the first answer count in the first period on both sides).
    let start_schedule = match (&plan.controller, &cfg.start_gate) {
        (Some(c), Some(g)) => {
            let (g, admin) = (g.clone(), rein_runtime::admin_client::AdminEndpoint::from(c.admin));
            Some(tokio::spawn(async move {
                g.ready.notified().await;
                let body = serde_json::json!({});
                let r = rein_runtime::admin_client::put_json(&admin, None, "/api/pshift/start", &body).await;
                // The load goes on either way; a failure ends the run once it is back.
                g.go.notify_one();
                r
            }))
        }
        _ => None,
    };
    let watch = async {
        loop {
            if let Some(d) = sup.lock().expect("supervisor lock").poll() {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let hosts = HostPoller::new(sc, plan);
    let interval = Duration::from_nanos(sc.interval().0);
    // The hosts are read while the load runs; a load that fails ends the run at once (not after the
    // poller's last sample), and the last sample is waited for once the load is done.
    let both = async {
        let run = rein_runtime::load::run_checked(cfg, live);
        let poll = hosts.poll(interval);
        tokio::pin!(run, poll);
        let mut samples = None;
        let outcome = loop {
            tokio::select! {
                r = &mut run => break r?,
                s = &mut poll, if samples.is_none() => samples = Some(s),
            }
        };
        let samples = match samples {
            Some(s) => s,
            None => poll.await,
        };
        Ok::<_, LoadError>((outcome, samples))
    };
    let ran = tokio::select! {
        r = both => r.map_err(RunError::from),
        d = watch => Err(RunError::Died(d)),
    };
    let (Outcome { mut totals, failures }, samples) = match ran {
        Ok(x) => x,
        Err(e) => {
            // A load that failed before its connections were open never said it was ready.
            if let Some(task) = &start_schedule {
                task.abort();
            }
            return Err(e);
        }
    };
    if let Some(task) = start_schedule {
        let started = task.await.map_err(|e| e.to_string()).and_then(|r| r.map(|_| ()).map_err(|e| e.to_string()));
        if let Err(e) = started {
            return Err(RunError::Controller(format!("starting the pShift controller's schedule: {e}")));
        }
    }
    if let Some(c) = &plan.controller {
        // The controller's rounds of the run (it keeps the last MAX_ROUNDS_KEPT; its schedule's origin is
        // the run's start, so `at_s` is run time).
        let admin = rein_runtime::admin_client::AdminEndpoint::from(c.admin);
        // A period that ends with the run is closed by the boundary at the run's end, whose round is
        // answered once the nodes' reports are in, about when the load has drained: wait for it (the
        // simulator closes it too), for at most PERIOD_CLOSE_WAIT.
        let expected = sc.pshift().map_or(0, |ps| sc.duration().0.saturating_sub(ps.start.0) / ps.period.0.max(1));
        let deadline = tokio::time::Instant::now() + PERIOD_CLOSE_WAIT;
        // Every bucket's tally counts the same periods: the first one's is the controller's.
        let (status, tallied) = loop {
            let status: rein_runtime::pshift_controller::ControllerStatus =
                rein_runtime::admin_client::get_json(&admin, None, "/api/pshift")
                    .await
                    .map_err(|e| RunError::Controller(format!("reading the pShift controller's rounds: {e}")))?;
            let closed = status.buckets.first().map_or(expected, |b| b.periods.closed);
            if closed >= expected {
                break (status, closed);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    "the pShift controller closed {closed} of the run's {expected} QoS periods within {} s of the \
                     load's end: the periods' tally and periods.csv leave the rest out",
                    PERIOD_CLOSE_WAIT.as_secs()
                );
                break (status, closed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if status.rounds.len() == rein_runtime::pshift_controller::MAX_ROUNDS_KEPT {
            tracing::warn!(
                "the pShift controller keeps its last {} rounds: rounds.csv starts at round {}",
                rein_runtime::pshift_controller::MAX_ROUNDS_KEPT,
                status.rounds.front().map_or(0, |r| r.round)
            );
        }
        if status.late_reports > 0 {
            tracing::info!(
                "the pShift controller counted {} nodes' reports that came after their round's timeout (a loaded \
                 machine): their IOs count in their periods, the tokens of those rounds were computed without them",
                status.late_reports
            );
        }
        let end = sc.duration().as_secs_f64();
        totals.rounds = status.rounds.into_iter().filter(|r| r.at_s < end).collect();
        // The closed periods one by one: those its tally above counts (a period closed since is left out).
        let closed: rein_runtime::pshift_controller::PeriodsStatus =
            rein_runtime::admin_client::get_json(&admin, None, "/api/pshift/periods")
                .await
                .map_err(|e| RunError::Controller(format!("reading the pShift controller's periods: {e}")))?;
        if closed.dropped > 0 {
            tracing::warn!(
                "the pShift controller keeps its newest {} bucket-periods: periods.csv starts at period {}",
                rein_runtime::pshift_controller::MAX_PERIOD_CELLS_KEPT,
                closed.periods.front().map_or(0, |r| r.period)
            );
        }
        let qos = |b: &rein_runtime::pshift_controller::BucketStatus| rein_core::pshift::BucketQos {
            reservation: b.reservation,
            limit: b.limit,
        };
        totals.period_log = rein_model::report::rounds::PeriodLog {
            buckets: status.buckets.iter().map(|b| (b.name.clone(), qos(b))).collect(),
            records: closed.periods.into_iter().filter(|r| r.period < tallied).collect(),
        };
        totals.periods = status.buckets.into_iter().map(|b| (b.name, b.periods)).collect();
    }
    if let Some(h) = hosts.finish(sc, samples).await {
        totals.summary.hosts = Some(h.summary.clone());
        totals.hosts = Some(h);
    }
    Ok(Outcome { totals, failures })
}

/// One read of a PARDA host's `/api/parda`: when (run time), its IOs completed and their summed latency.
#[derive(Clone, Copy, Debug)]
struct HostSample {
    at: Duration,
    completed: u64,
    latency_sum_ns: u64,
}

/// Reads every PARDA host's `/api/parda` once per interval while the load runs, then its period history,
/// into the simulator's host report ([`rein_model::report::hosts`]): per interval the IOs the host
/// completed and their latency, and at each period end its window, beta, signal and estimate. A host's
/// clock is its own: its periods are placed on the run's time by the offset read at the start. At the
/// start each host's current period is moved to end where the simulator's host ends its first
/// (`PUT /api/parda/period`; [`rein_model::parda_settings::Parda::first_period_end`]), so the hosts tick
/// in the simulator's order and phase.
struct HostPoller {
    admins: Vec<rein_runtime::admin_client::AdminEndpoint>,
    /// Per host: when its first period ends, from the run's start.
    first_ends: Vec<Duration>,
    duration: Duration,
    /// Fixed issue queues resized during the run (a host's `window_schedule`): (when, host, IOs), in time
    /// order.
    steps: Vec<(Duration, usize, f64)>,
}

impl HostPoller {
    fn new(sc: &Scenario, plan: &Plan) -> HostPoller {
        let mut steps: Vec<(Duration, usize, f64)> = sc
            .hosts()
            .iter()
            .enumerate()
            .flat_map(|(h, host)| host.window_schedule.iter().map(move |&(at, w)| (Duration::from_nanos(at.0), h, w)))
            .collect();
        steps.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let first_ends = match sc.parda() {
            Some(p) => (0..sc.hosts().len())
                .map(|h| Duration::from_nanos(p.first_period_end(sc.seed(), h, sc.hosts().len()).0))
                .collect(),
            None => Vec::new(),
        };
        HostPoller {
            admins: plan.host_admins.iter().map(|&a| a.into()).collect(),
            first_ends,
            duration: Duration::from_nanos(sc.duration().0),
            steps,
        }
    }

    async fn status(&self, h: usize) -> Option<rein_runtime::parda_host::HostStatus> {
        rein_runtime::admin_client::get_json(&self.admins[h], None, "/api/parda").await.ok()
    }

    /// Samples per host (the first at the start, with each host's clock offset), until the run's end.
    async fn poll(&self, interval: Duration) -> Vec<(f64, Vec<HostSample>)> {
        if self.admins.is_empty() {
            return Vec::new();
        }
        let start = tokio::time::Instant::now();
        for (h, (admin, &end)) in self.admins.iter().zip(&self.first_ends).enumerate() {
            let body = serde_json::json!({ "ends_in_s": end.saturating_sub(start.elapsed()).as_secs_f64() });
            if let Err(e) = rein_runtime::admin_client::put_json(admin, None, "/api/parda/period", &body).await {
                tracing::warn!(host = h, "placing a host's control periods failed (it ticks from its own start): {e}");
            }
        }
        let mut out: Vec<(f64, Vec<HostSample>)> = Vec::with_capacity(self.admins.len());
        for h in 0..self.admins.len() {
            let s = self.status(h).await;
            let at = start.elapsed();
            let (offset, sample) = match s {
                Some(s) => (
                    s.now_s - at.as_secs_f64(),
                    HostSample { at, completed: s.completed, latency_sum_ns: s.latency_sum_ns },
                ),
                None => (0.0, HostSample { at, completed: 0, latency_sum_ns: 0 }),
            };
            out.push((offset, vec![sample]));
        }
        let mut k = 1u32;
        let mut next_step = 0;
        while interval * k <= self.duration {
            // Resizes due before the next sample go first, each at its time.
            while let Some(&(at, h, window)) = self.steps.get(next_step).filter(|s| s.0 < interval * k) {
                tokio::time::sleep_until(start + at).await;
                let body = serde_json::json!({ "window": window });
                if let Err(e) =
                    rein_runtime::admin_client::put_json(&self.admins[h], None, "/api/parda/window", &body).await
                {
                    tracing::warn!(host = h, window, "resizing a host's issue queue failed: {e}");
                }
                next_step += 1;
            }
            tokio::time::sleep_until(start + interval * k).await;
            for (h, (_, samples)) in out.iter_mut().enumerate() {
                if let Some(s) = self.status(h).await {
                    samples.push(HostSample {
                        at: start.elapsed(),
                        completed: s.completed,
                        latency_sum_ns: s.latency_sum_ns,
                    });
                }
            }
            k += 1;
        }
        out
    }

    /// The host report from the samples and each host's period history (read now, after the run).
    async fn finish(
        &self,
        sc: &Scenario,
        samples: Vec<(f64, Vec<HostSample>)>,
    ) -> Option<rein_model::report::hosts::HostTotals> {
        if samples.is_empty() {
            return None;
        }
        let intervals = rein_model::recorder::intervals(sc.duration(), sc.interval());
        // A host per scenario host: the scenario's validation holds them within the bound.
        let mut rec = rein_model::report::hosts::HostRecorder::new(
            samples.len(),
            sc.interval(),
            intervals,
            rein_model::recorder::MAX_CELLS,
        )
        .ok()?;
        let half = sc.interval().0 / 2;
        for (h, (offset, s)) in samples.iter().enumerate() {
            for w in s.windows(2) {
                let at = rein_core::Nanos::from_duration(w[1].at).saturating_sub(rein_core::Nanos(half));
                if at >= sc.duration() {
                    continue;
                }
                let ios = u32::try_from(w[1].completed.saturating_sub(w[0].completed)).unwrap_or(u32::MAX);
                rec.completions(h, at, ios, w[1].latency_sum_ns.saturating_sub(w[0].latency_sum_ns));
            }
            if let Some(st) = self.status(h).await {
                warn_of_mishaps(&sc.hosts()[h].name, &st);
                self.check_first_period(sc, h, &st, *offset);
                for p in &st.history {
                    let at = p.at_s - offset;
                    if at < 0.0 || at >= sc.duration().as_secs_f64() {
                        continue;
                    }
                    let ms = |v: Option<f64>| v.unwrap_or(0.0) * 1e6;
                    rec.period(
                        h,
                        rein_core::Nanos::from_secs_f64(at),
                        p.window,
                        p.beta,
                        ms(p.signal_ms),
                        ms(p.estimate_ms),
                    );
                }
            }
        }
        Some(rec.finish(rein_sim::report::hosts_meta(sc)?))
    }

    /// Warns when host `h`'s first period in the run did not end where the simulator's does (within
    /// half the spacing of staggered hosts, period / (2 hosts)): a host that missed `PUT
    /// /api/parda/period`, or a machine too busy to place it, may tick in another order than the
    /// simulator's hosts, which can change who leads the run's start. `st` is the host's status, its
    /// period list on its own clock (`offset` ahead of the run's); unchecked if the list has dropped its
    /// oldest periods.
    fn check_first_period(
        &self,
        sc: &Scenario,
        h: usize,
        st: &rein_runtime::parda_host::HostStatus,
        offset: f64,
    ) -> Option<()> {
        let want = self.first_ends.get(h)?.as_secs_f64();
        if st.history.len() as u64 != st.periods {
            return None;
        }
        let got = st.history.iter().map(|p| p.at_s - offset).find(|&at| at >= 0.0)?;
        let period = sc.parda()?.config.period.as_secs_f64();
        if (got - want).abs() > period / (2.0 * sc.hosts().len() as f64) {
            tracing::warn!(
                host = %sc.hosts()[h].name,
                "PARDA host ended its first period at {got:.3} s into the run, the simulator's at {want:.3} s: \
                 its periods may tick in another order than the simulator's"
            );
        }
        Some(())
    }
}

/// Names what PARDA host `name` counted during the run (`st`, read at its end) that bears on the run's
/// results, with the counts:
/// - records of another host under its own id (`id_conflicts`): two hosts shared an id, and their peers
///   took them for one host (one entry in the cluster signal): an error, the run's PARDA results are not
///   to be trusted;
/// - a peer's board slot switching between two incarnations, both advancing (`peer_id_conflicts`): two
///   other hosts shared an id, an error as well;
/// - reports it refused or failed to exchange (`records_refused`, `exchange_errors`): the signal rested
///   on fewer hosts than the scenario has;
/// - stalls of its process (`stalls`, `stalled_ios`): it did not run for a while (stopped, or a machine
///   too busy), its IOs across each stall were left out of eq. (1), and the load's timing was disturbed.
///
/// Each host's log says more (when, from where, each stall's length).
fn warn_of_mishaps(name: &str, st: &rein_runtime::parda_host::HostStatus) {
    if st.id_conflicts > 0 {
        tracing::error!(
            host = %name,
            id = st.id,
            id_conflicts = st.id_conflicts,
            last_from = st.id_conflict_from.as_deref().unwrap_or("?"),
            "PARDA host received reports under its own id from another host: two hosts shared one id and their \
             peers took them for one host, so this run's PARDA results are not to be trusted"
        );
    }
    if st.peer_id_conflicts > 0 {
        tracing::error!(
            host = %name,
            peer_id_conflicts = st.peer_id_conflicts,
            last = st.peer_id_conflict.as_deref().unwrap_or("?"),
            "PARDA host read one peer's board slot switching between two incarnations, both advancing: two other \
             hosts shared one id and the peers took them for one host, so this run's PARDA results are not to be \
             trusted"
        );
    }
    if st.records_refused > 0 || st.exchange_errors > 0 {
        tracing::warn!(
            host = %name,
            refused = st.records_refused,
            exchange_errors = st.exchange_errors,
            "PARDA host refused reports of other hosts or failed to exchange its own (its log says why)"
        );
    }
    if st.stalls > 0 {
        tracing::warn!(
            host = %name,
            stalls = st.stalls,
            stalled_ios = st.stalled_ios,
            "PARDA host's process stalled (it did not run for a while: stopped, or the machine too busy); the IOs \
             answered across the stalls were left out of its latency estimate, and the run's timing was disturbed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_runtime::load::Layout;

    /// The driver's layout aims with [`plan::aim`] and counts a completion at the node the gateway's
    /// own layout (`Stripe::locate`) puts its offset on.
    #[test]
    fn a_volume_counts_each_offset_at_its_node() {
        let stripe = rein_model::stripe::Stripe::new(64 << 10, &[1, 2]).unwrap();
        let v = Volume { stripe: stripe.clone(), size: 3 << 20 };
        // Units of 64 KiB: 0 on node 0, 1 and 2 on node 1, 3 on node 0, ...
        for (offset, node) in [(0, 0), (64 << 10, 1), ((128 << 10) + 8192, 1), (192 << 10, 0)] {
            assert_eq!(v.window_of(offset), node, "offset {offset}");
        }
        for k in 0..2 {
            assert_eq!(v.window_of(v.aim(k, 4096 * 1000, 4096)), k);
        }
    }

    /// A PARDA host's counts of the run's mishaps are named at its end, with the counts: records of
    /// another host under its own id and a peer's slot switching between two incarnations as errors, stalls of its process as a warning (here from an admin
    /// endpoint that answers `/api/parda` with those counts).
    #[test]
    fn a_hosts_id_conflicts_and_stalls_are_named_at_the_run_end() {
        use std::io::{Read, Write};
        let sc = Scenario::from_toml(
            "name = \"one-host\"\nduration_s = 2.0\n[parda]\nlatency_threshold_ms = 10\n[[servers]]\n\
             name = \"array\"\ncapacity_iops = 1000\n[[hosts]]\nname = \"h1\"\n[[tenants]]\nname = \"vm1\"\n\
             host = \"h1\"\n[tenants.workload]\nkind = \"closed\"\n",
            None,
        )
        .unwrap();
        let status = r#"{"id": 0, "controlled": true, "aggregation": "cluster", "window": 4.0, "issue_limit": 4,
            "beta": 1.0, "beta_base": 1.0, "vms": 1, "outstanding": 0, "queued": 0, "estimate_ms": null,
            "signal_ms": null, "cluster_hosts": 1, "periods": 0, "completed": 0, "abandoned": 0,
            "latency_sum_ns": 0, "now_s": 1.0, "exchange_errors": 0, "records_refused": 0, "id_conflicts": 3,
            "id_conflict_from": "127.0.0.9:7711", "peer_id_conflicts": 5, "peer_id_conflict": "host 1 from slot 1", "stalls": 2, "stalled_ios": 17, "history": []}"#;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut conn = conn.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{status}",
                    status.len()
                );
            }
        });
        let poller = HostPoller {
            admins: vec![admin.into()],
            first_ends: Vec::new(),
            duration: Duration::from_secs(2),
            steps: Vec::new(),
        };
        let samples = vec![(0.0, vec![HostSample { at: Duration::ZERO, completed: 0, latency_sum_ns: 0 }])];
        let logs = rein_testkit::Logs::new();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let report = tracing::subscriber::with_default(logs.subscriber(), || rt.block_on(poller.finish(&sc, samples)));
        assert!(report.is_some());
        let log = logs.text();
        let line = |word: &str| log.lines().find(|l| l.contains(word)).unwrap_or_else(|| panic!("{word}: {log}"));
        let conflict = line("its own id");
        assert!(conflict.starts_with("ERROR"), "{log}");
        assert!(conflict.contains("not to be trusted"), "{log}");
        for field in ["host=h1", "id_conflicts=3", "last_from=\"127.0.0.9:7711\""] {
            assert!(conflict.contains(field), "{field}: {log}");
        }
        let peers = line("switching between two incarnations");
        assert!(peers.starts_with("ERROR"), "{log}");
        for field in ["host=h1", "peer_id_conflicts=5", "last=\"host 1 from slot 1\""] {
            assert!(peers.contains(field), "{field}: {log}");
        }
        let stall = line("stalled");
        assert!(stall.starts_with(" WARN"), "{log}");
        for field in ["host=h1", "stalls=2", "stalled_ios=17"] {
            assert!(stall.contains(field), "{field}: {log}");
        }
    }

    /// A tenant's load is one ordered stream where one connection holds its window, as the simulator's
    /// tenant is ([`CONNECTIONS_PER_TENANT`]); an open loop's backlog still gets the connections it needs.
    #[test]
    fn a_closed_loop_is_one_ordered_stream() {
        let ports = |_: std::net::Ipv4Addr, k: u16| Ok(20_000 + k);
        let sc = Scenario::from_toml(include_str!("../../../scenarios/mclock-table5-batch.toml"), None).unwrap();
        let plan = Plan::new(&sc, ports).unwrap();
        let conns: Vec<usize> = jobs(&sc, &plan).iter().map(|j| j.connections).collect();
        // vm1: bursts of 128 every 400 ms for 120 s may all queue (301 x 128 = 38,528 requests); vm2: a
        // closed loop of 32.
        assert_eq!(conns, vec![38_528usize.div_ceil(256), 1]);
    }
}
