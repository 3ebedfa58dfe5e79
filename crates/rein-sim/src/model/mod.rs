//! The model layer: a scenario validated once into typed values.
//!
//! [`Scenario::load`] reads a file ([`crate::file`]) and validates it: values in range, names resolved to
//! indices, devices and workloads built as rein-model's [`rein_model::DeviceSpec`] and
//! [`rein_model::WorkloadSpec`], expectations typed ([`expect`]). Everything after this layer (the run,
//! the report, the checks) works on these values and never sees the TOML again. One file per feature:
//! [`server`], [`tenant`], [`expect`], [`parda`] (PARDA hosts), [`pshift`] (pShift clusters); [`group`]
//! cuts a scenario into the parts that can run apart.

pub mod expect;
pub mod group;
pub mod parda;
pub mod pshift;
pub mod server;
pub mod tenant;

pub use expect::{ExpectError, ExpectFault, Expectation};
pub use group::Group;
pub use server::{parse_scheduler, NamedScheduler, Server, ServerError, ServerFault};
pub use tenant::{Tenant, TenantError, TenantFault};

use crate::file::{FileError, ScenarioFile};
use rein_core::{Nanos, Num, SchedConfig, SchedulerKind};
use rein_model::sched_settings::{
    with_cost_model_shorthand, CostModelTwice, SchedSettingsFile, SettingsError, UnknownSimScheduler,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest number of servers in a scenario.
pub const MAX_SERVERS: usize = 1024;
/// Largest number of tenants (or pShift buckets) in a scenario.
pub const MAX_TENANTS: usize = 1_000_000;
/// Longest run (s): a week.
pub const MAX_DURATION_S: f64 = rein_model::workload::MAX_SECONDS;
/// Largest number of timeseries intervals (duration / interval).
pub const MAX_INTERVALS: usize = 1_000_000;
/// Most tenant-server pairs (the sum over tenants of the servers each uses). A pair holds a scheduler
/// entry at its server and a gateway link, about 700 bytes in all: two million take about 1.4 GB.
pub const MAX_PAIRS: usize = 2_000_000;
/// Most requests on the network at once (checked at load): the open loops' requests issued within one
/// `network.delay_ms` (each on its way to its server, then its response on its way back, holds a request
/// slot and an event, about 100 bytes: a million take about 100 MB, twice that at worst as the vectors
/// grow). A workload at the largest rate (10^7 IOPS) may have a delay of 100 ms.
pub const MAX_NETWORK_IN_FLIGHT: f64 = 1e6;
/// Most tenants x servers: each server keeps a 4-byte count per tenant of the scenario (400 MB at the
/// bound).
pub const MAX_TENANTS_X_SERVERS: usize = 100_000_000;

/// A scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read or parsed.
    #[error(transparent)]
    File(#[from] FileError),
    /// A value is out of range or a name unknown: [`ModelError`] names it.
    #[error("scenario {scenario}: {error}")]
    Invalid {
        /// The scenario as errors name it ([`Scenario::label`]): its file's path, or its name in quotes
        /// for text given directly.
        scenario: String,
        /// What is wrong.
        error: ModelError,
    },
}

/// What is wrong with a scenario that parsed: the key, the value and the bound, or the entry (a server,
/// a tenant) and what is wrong with it. Its message names the field once ([`ScenarioError::Invalid`]
/// adds the scenario).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `name` is empty.
    #[error("name must not be empty")]
    EmptyName,
    /// `name` holds a control character (the outputs carry it).
    #[error("name {text:?} has a control character (a line break, tab or escape)")]
    ControlCharacter {
        /// The name.
        text: String,
    },
    /// `duration_s` is not in (0, max].
    #[error("duration_s must be more than 0 and at most {max} s, got {}", Num(*.got))]
    Duration {
        /// The longest run ([`MAX_DURATION_S`]).
        max: f64,
        /// The value given.
        got: f64,
    },
    /// A time (`warmup_s`, `interval_s`) outside [0, max] seconds.
    #[error("{key} must be between 0 and {max} s, got {}", Num(*.got))]
    Seconds {
        /// The key.
        key: &'static str,
        /// The longest time accepted ([`MAX_DURATION_S`]).
        max: f64,
        /// The value given.
        got: f64,
    },
    /// `warmup_s` at or after `duration_s`.
    #[error("warmup_s ({warmup_s}) must be less than duration_s ({duration_s})")]
    Warmup {
        /// `warmup_s`.
        warmup_s: f64,
        /// `duration_s`.
        duration_s: f64,
    },
    /// `interval_s` under a millisecond.
    #[error("interval_s must be at least 0.001")]
    IntervalTooShort,
    /// More than `max` timeseries intervals.
    #[error("duration_s / interval_s exceeds {max} intervals")]
    TooManyIntervals {
        /// The most intervals ([`MAX_INTERVALS`]).
        max: usize,
    },
    /// `interval_s` above `duration_s`.
    #[error(
        "interval_s ({}) must not exceed duration_s ({duration_s}): the timeseries would have one partial interval",
        Num(*.interval_s)
    )]
    IntervalAboveDuration {
        /// `interval_s`.
        interval_s: f64,
        /// `duration_s`.
        duration_s: f64,
    },
    /// `cost_model` given both at the top and in `[mclock]`.
    #[error("{0}")]
    CostModelTwice(CostModelTwice),
    /// A `[mclock]` setting is refused.
    #[error("{0}")]
    Sched(SettingsError),
    /// `network.delay_ms` outside [0, 10000].
    #[error("network.delay_ms must be between 0 and 10000, got {got}")]
    NetworkDelay {
        /// The value given.
        got: f64,
    },
    /// The scenario's `scheduler` names no scheduler.
    #[error("{0}")]
    Scheduler(UnknownSimScheduler),
    /// No `[[servers]]`.
    #[error("at least one [[servers]] is needed")]
    NoServers,
    /// More than `max` servers.
    #[error("at most {max} servers")]
    TooManyServers {
        /// [`MAX_SERVERS`].
        max: usize,
    },
    /// No `[[tenants]]` (and no `[pshift]` to generate them).
    #[error("at least one [[tenants]] is needed")]
    NoTenants,
    /// More than `max` tenants.
    #[error("at most {max} tenants")]
    TooManyTenants {
        /// [`MAX_TENANTS`].
        max: usize,
    },
    /// A server is refused.
    #[error("{0}")]
    Server(ServerError),
    /// A tenant is refused.
    #[error("{0}")]
    Tenant(TenantError),
    /// The servers' or the tenants' names are refused.
    #[error("{0}")]
    Name(NameError),
    /// `[mclock]` settings other than `cost_model` in a `[pshift]` scenario.
    #[error(
        "[mclock]: a [pshift] scenario's servers run pShift's token scheduler, which takes only cost_model from it"
    )]
    MclockInPshift,
    /// Both PARDA hosts and a pShift cluster.
    #[error("a scenario has either PARDA hosts ([parda], [[hosts]]) or a pShift cluster ([pshift]), not both")]
    PardaAndPshift,
    /// More tenant-server pairs than `max` ([`MAX_PAIRS`]).
    #[error(
        "{pairs} tenant-server pairs (each tenant times the servers it uses) exceed the bound of {max} (about 700 \
         bytes each)"
    )]
    TooManyPairs {
        /// The pairs.
        pairs: usize,
        /// [`MAX_PAIRS`].
        max: usize,
    },
    /// Tenants x servers above `max` ([`MAX_TENANTS_X_SERVERS`]).
    #[error("{tenants} tenants x {servers} servers exceed the bound of {max} (each server keeps a count per tenant)")]
    TenantsXServers {
        /// The tenants.
        tenants: usize,
        /// The servers.
        servers: usize,
        /// [`MAX_TENANTS_X_SERVERS`].
        max: usize,
    },
    /// The timeseries would keep more than [`rein_model::recorder::MAX_CELLS`] cells: (tenants + servers)
    /// x intervals.
    #[error("duration_s {} / interval_s {} = {} intervals: {cells}", Num(*.duration_s), Num(*.interval_s), .cells.intervals)]
    Timeseries {
        /// The cells asked for, and the bound's message.
        cells: rein_model::recorder::TooManyCells,
        /// `duration_s`.
        duration_s: f64,
        /// `interval_s`.
        interval_s: f64,
    },
    /// The PARDA hosts' timeseries would keep more than [`rein_model::recorder::MAX_CELLS`] cells: hosts x
    /// intervals.
    #[error("duration_s {} / interval_s {} = {} intervals: {cells}", Num(*.duration_s), Num(*.interval_s), .cells.intervals)]
    HostTimeseries {
        /// The cells asked for, and the bound's message.
        cells: rein_model::report::hosts::TooManyHostCells,
        /// `duration_s`.
        duration_s: f64,
        /// `interval_s`.
        interval_s: f64,
    },
    /// The open loops would hold more than `max` requests on the network at once.
    #[error(
        "network.delay_ms {} x the open loops' rates: {} requests would be on the network at once (tenant {tenant}'s \
         {}, by its rate x the delay), above the bound of {} (each holds memory until it is served)",
        Num(*.delay_ms),
        Num(*.requests),
        Num(*.tenant_requests),
        Num(*.max)
    )]
    NetworkInFlight {
        /// `network.delay_ms`.
        delay_ms: f64,
        /// The requests on the network at once, about (rounded).
        requests: f64,
        /// The tenant with the most.
        tenant: String,
        /// Its requests (rounded).
        tenant_requests: f64,
        /// [`MAX_NETWORK_IN_FLIGHT`].
        max: f64,
    },
    /// `[parda]` or `[[hosts]]` is refused (boxed: the largest of these errors).
    #[error("{0}")]
    Parda(Box<parda::HostsError>),
    /// `[pshift]` is refused.
    #[error("{0}")]
    Pshift(pshift::PshiftError),
    /// An `[[expect]]` is refused.
    #[error("{0}")]
    Expect(ExpectError),
}

/// What is wrong with the names of a scenario's servers, tenants or hosts.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    /// A server, tenant or host without a name.
    #[error("a {what} has an empty name")]
    Empty {
        /// `server`, `tenant` or `host`.
        what: &'static str,
    },
    /// A name with a control character.
    #[error("{what} name {name:?} has a control character (a line break, tab or escape)")]
    ControlCharacter {
        /// `server`, `tenant` or `host`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// Two servers, tenants or hosts of one name.
    #[error("two {what}s are named {name:?}")]
    Repeated {
        /// `server`, `tenant` or `host`.
        what: &'static str,
        /// The name.
        name: String,
    },
}

/// A validated scenario.
///
/// It holds what validation checked, and the run relies on it (the engine's `expect`s among others): every
/// value within its bound (the times, the sizes, [`MAX_PAIRS`] and this module's other bounds), every name
/// unique and every reference resolved (a tenant's servers and host, an expectation's tenants, servers and
/// hosts are indices into this scenario's lists), PARDA hosts and a pShift cluster not both, a pShift
/// cluster's tenants its buckets as drawn from the seed, and every server's scheduler one its section allows
/// (the token scheduler only in a pShift cluster, and only it there).
///
/// Only validated construction makes one: [`Scenario::load`], [`Scenario::from_toml`] and
/// [`ScenarioFile::validate`] (with [`ScenarioFile::validate_as`] and [`ScenarioFile::validate_at`]), and
/// the copies made from a valid one that keep all this: [`Scenario::with_seed`] (which draws the buckets
/// again), [`Scenario::with_scheduler`], [`Scenario::with_scheduler_named`], [`Scenario::without_parda`],
/// [`Scenario::part`] and [`crate::check::Sabotage::apply`] (whose copy keeps the checks of the scenario it
/// weakens: they are what it is run against; but for the controller's tally, which `no-controller` drops). Its fields are private to this crate: other crates read them
/// through the methods of the same names ([`Scenario::tenants`], [`Scenario::servers`], ...), so none can
/// edit a valid scenario into one the run would trip on; a variant is a changed [`ScenarioFile`], validated.
///
/// ```
/// let text = "name = \"n\"\nduration_s = 4\n[[servers]]\nname = \"a\"\ncapacity_iops = 1000\n\
///             [[tenants]]\nname = \"t\"\n[tenants.workload]\nkind = \"closed\"\noutstanding = 1\n";
/// let sc = rein_sim::Scenario::from_toml(text, None).unwrap();
/// assert_eq!((sc.name(), sc.tenants().len(), sc.servers()[0].name.as_str()), ("n", 1, "a"));
/// ```
///
/// The same scenario's tenants emptied from outside this crate: refused at compile time.
///
/// ```compile_fail
/// let text = "name = \"n\"\nduration_s = 4\n[[servers]]\nname = \"a\"\ncapacity_iops = 1000\n\
///             [[tenants]]\nname = \"t\"\n[tenants.workload]\nkind = \"closed\"\noutstanding = 1\n";
/// let mut sc = rein_sim::Scenario::from_toml(text, None).unwrap();
/// sc.tenants.clear();
/// ```
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name.
    pub(crate) name: String,
    /// The file it was read from ([`Scenario::load`]; `None` for text given directly).
    pub(crate) path: Option<PathBuf>,
    /// The sabotage this run is under (`rein sim --sabotage`, [`crate::check::Sabotage`]): its name, for
    /// the reports. `None` for the scenario as written.
    pub(crate) sabotage: Option<&'static str>,
    /// What it reproduces.
    pub(crate) description: String,
    /// Simulated time: the run ends here (positive, at most [`MAX_DURATION_S`]).
    pub(crate) duration: Nanos,
    /// Time excluded from the totals (summary.json), less than `duration`; the timeseries covers it.
    pub(crate) warmup: Nanos,
    /// The run's seed: every random draw of the run derives from it, including those made while validating
    /// (pShift's generated buckets). Read with [`Scenario::seed`], changed only through
    /// [`Scenario::with_seed`], which draws those again.
    seed: u64,
    /// Timeseries interval (at least 1 ms, at most [`MAX_INTERVALS`] of them in `duration`).
    pub(crate) interval: Nanos,
    /// The scenario-wide scheduler settings (`[mclock]`, with `cost_model`): what a PARDA host's local
    /// scheduler uses; servers carry their own ([`Server::sched`]), with their table over this one.
    pub(crate) sched: SchedConfig,
    /// One-way delay between gateways and servers.
    pub(crate) net_delay: Nanos,
    /// Servers, in file order.
    pub(crate) servers: Vec<Server>,
    /// Tenants in file order, names unique; in a pShift cluster its buckets (written, or generated as `b0`,
    /// `b1`, ...).
    pub(crate) tenants: Vec<Tenant>,
    /// What `--check` verifies.
    pub(crate) expect: Vec<Expectation>,
    /// The default scheduler name as written (for reports).
    pub(crate) scheduler_name: String,
    /// PARDA parameters, when the scenario has hosts.
    pub(crate) parda: Option<parda::Parda>,
    /// PARDA hosts in file order (empty without `[[hosts]]`).
    pub(crate) hosts: Vec<parda::Host>,
    /// A pShift cluster: tenants are its buckets.
    pub(crate) pshift: Option<Arc<pshift::PshiftSection>>,
}

impl Scenario {
    /// Reads and validates a scenario file. Relative trace paths resolve against the file's directory.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        ScenarioFile::read(path)?.validate_at(path)
    }

    /// How errors name the scenario, after `scenario `: its file's path as given, or for text given
    /// directly its name in double quotes.
    pub fn label(&self) -> String {
        label(self.path.as_deref(), &self.name)
    }

    /// Parses and validates scenario text (trace paths relative to `base`).
    pub fn from_toml(text: &str, base: Option<&Path>) -> Result<Scenario, ScenarioError> {
        ScenarioFile::parse(text)?.validate(base)
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Its name (not empty, no control character).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file it was read from ([`Scenario::load`], [`ScenarioFile::validate_at`]); `None` for text given
    /// directly.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The sabotage this run is under (`rein sim --sabotage`, [`crate::check::Sabotage`]): its name, for the
    /// reports. `None` for the scenario as written.
    pub fn sabotage(&self) -> Option<&'static str> {
        self.sabotage
    }

    /// What it reproduces.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Simulated time: the run ends here (positive, at most [`MAX_DURATION_S`]).
    pub fn duration(&self) -> Nanos {
        self.duration
    }

    /// Time excluded from the totals (summary.json), less than [`Scenario::duration`].
    pub fn warmup(&self) -> Nanos {
        self.warmup
    }

    /// Timeseries interval (at least 1 ms, at most [`MAX_INTERVALS`] of them in the duration).
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// The scenario-wide scheduler settings (`[mclock]`, with `cost_model`).
    pub fn sched(&self) -> SchedConfig {
        self.sched
    }

    /// One-way delay between gateways and servers.
    pub fn net_delay(&self) -> Nanos {
        self.net_delay
    }

    /// Servers, in file order.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// Tenants in file order, names unique; in a pShift cluster its buckets.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// What `--check` verifies.
    pub fn expect(&self) -> &[Expectation] {
        &self.expect
    }

    /// The default scheduler's name as written (for reports).
    pub fn scheduler_name(&self) -> &str {
        &self.scheduler_name
    }

    /// PARDA parameters, when the scenario has hosts.
    pub fn parda(&self) -> Option<&parda::Parda> {
        self.parda.as_ref()
    }

    /// PARDA hosts in file order (empty without `[[hosts]]`).
    pub fn hosts(&self) -> &[parda::Host] {
        &self.hosts
    }

    /// A pShift cluster: tenants are its buckets.
    pub fn pshift(&self) -> Option<&pshift::PshiftSection> {
        self.pshift.as_deref()
    }

    /// A copy with another seed. What validation drew from the seed is drawn again (pShift's generated
    /// buckets: reservations, active servers, demand changes), so a run with `--seed N` is the run of the
    /// file with `seed = N`, not the same cluster with other service times. Other changes made to this
    /// scenario (a scheduler, a sabotage) are kept: the buckets are the only thing replaced.
    pub fn with_seed(&self, seed: u64) -> Result<Scenario, ScenarioError> {
        let mut s = self.clone();
        s.seed = seed;
        if let Some(ps) = &mut s.pshift {
            if let Some(r) = ps.regenerate(&self.servers, seed, self.duration) {
                let (tenants, buckets) =
                    r.map_err(|e| ScenarioError::Invalid { scenario: self.label(), error: ModelError::Pshift(e) })?;
                Arc::make_mut(ps).buckets = buckets;
                s.tenants = tenants;
            }
        }
        Ok(s)
    }

    /// A copy running every server on `kind` (for side-by-side comparisons), held to what a file naming
    /// `kind` is: the token scheduler only in a pShift cluster, and only it there (`rein sim --scheduler
    /// token` ran plain round robin labelled token, which the file's `scheduler = "token"` is refused for).
    pub fn with_scheduler(&self, kind: SchedulerKind, distributed: bool) -> Result<Scenario, ScenarioError> {
        let mut s = self.clone();
        for srv in &mut s.servers {
            srv.scheduler = kind;
            srv.distributed = distributed;
        }
        s.scheduler_name = kind.name().to_string();
        check_schedulers(s.pshift.is_some(), &s.servers)
            .map_err(|e| ScenarioError::Invalid { scenario: self.label(), error: ModelError::Server(e) })?;
        Ok(s)
    }

    /// A copy running every server on the scheduler `named` ([`NamedScheduler`], parsed once where its
    /// name was given), as [`Scenario::with_scheduler`] does, with its name as given for the reports'
    /// scheduler (`rein sim --scheduler lfq` reports `lfq`, not the `sfq` it runs).
    pub fn with_scheduler_named(&self, named: &NamedScheduler) -> Result<Scenario, ScenarioError> {
        let mut s = self.with_scheduler(named.kind(), named.distributed())?;
        s.scheduler_name = named.name().to_string();
        Ok(s)
    }

    /// A copy with PARDA switched off: every host keeps a fixed issue queue (the uncontrolled baseline).
    pub fn without_parda(&self) -> Scenario {
        let mut s = self.clone();
        if let Some(p) = &mut s.parda {
            p.enabled = false;
        }
        s
    }

    /// The index of the tenant named `name`.
    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }

    /// The index of the server named `name`.
    pub fn server_index(&self, name: &str) -> Option<usize> {
        self.servers.iter().position(|t| t.name == name)
    }
}

/// [`Scenario::label`].
fn label(path: Option<&Path>, name: &str) -> String {
    match path {
        Some(p) => p.display().to_string(),
        None => format!("{name:?}"),
    }
}

/// A top-level time (the error is prefixed with the scenario's file or name by [`ScenarioError::Invalid`]).
fn secs(key: &'static str, got: f64) -> Result<Nanos, ModelError> {
    if !got.is_finite() || !(0.0..=MAX_DURATION_S).contains(&got) {
        return Err(ModelError::Seconds { key, max: MAX_DURATION_S, got });
    }
    Ok(Nanos::from_secs_f64(got))
}

/// A line break splits a row of the CSV outputs or forges a line of the report, an escape sequence
/// rewrites the terminal's table: text the outputs carry (the scenario's `name` here, the names in
/// [`check_unique`], an expectation's `note` in [`expect`]) may hold none.
fn no_control(text: &str) -> Result<(), ModelError> {
    if text.chars().any(char::is_control) {
        return Err(ModelError::ControlCharacter { text: text.to_string() });
    }
    Ok(())
}

/// Names of servers, tenants or hosts (`what`): not empty, no control character, no two alike.
pub(crate) fn check_unique<'a>(names: impl Iterator<Item = &'a str>, what: &'static str) -> Result<(), NameError> {
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        if n.trim().is_empty() {
            return Err(NameError::Empty { what });
        }
        if n.chars().any(char::is_control) {
            return Err(NameError::ControlCharacter { what, name: n.to_string() });
        }
        if !seen.insert(n) {
            return Err(NameError::Repeated { what, name: n.to_string() });
        }
    }
    Ok(())
}

/// The memory a run takes grows with the tenant-server pairs and with tenants x servers: both bounded
/// ([`MAX_PAIRS`], [`MAX_TENANTS_X_SERVERS`]), so a file cannot ask for more than the machine has (20,000
/// tenants on 1,024 servers once took 14.4 GB).
fn check_size(pairs: usize, tenants: usize, servers: usize) -> Result<(), ModelError> {
    if pairs > MAX_PAIRS {
        return Err(ModelError::TooManyPairs { pairs, max: MAX_PAIRS });
    }
    if tenants.saturating_mul(servers) > MAX_TENANTS_X_SERVERS {
        return Err(ModelError::TenantsXServers { tenants, servers, max: MAX_TENANTS_X_SERVERS });
    }
    Ok(())
}

/// The run keeps a timeseries cell per tenant and server per interval, and per PARDA host per interval,
/// each set within [`rein_model::recorder::MAX_CELLS`]. Checked here, counting and not allocating, so a
/// file asking for more is refused when it is loaded (`rein sim`, `rein cluster`), not once its run has
/// built its servers and tenants (the recorders check again, for a scenario changed since). Every host
/// has a VM and there is a server, so the hosts' cells are fewer than the tenants': the hosts' bound
/// binds first only when both are exceeded, and is checked first so that its error names the hosts.
fn check_timeseries(
    duration: Nanos,
    interval: Nanos,
    tenants: usize,
    servers: usize,
    hosts: usize,
) -> Result<(), ModelError> {
    use rein_model::recorder::{intervals, TooManyCells, MAX_CELLS};
    use rein_model::report::hosts::TooManyHostCells;
    let intervals = intervals(duration, interval);
    let (duration_s, interval_s) = (duration.as_secs_f64(), interval.as_secs_f64());
    TooManyHostCells::check(hosts, intervals, MAX_CELLS).map_err(|cells| ModelError::HostTimeseries {
        cells,
        duration_s,
        interval_s,
    })?;
    TooManyCells::check(tenants, servers, intervals).map_err(|cells| ModelError::Timeseries {
        cells,
        duration_s,
        interval_s,
    })
}

/// The token scheduler without a controller is plain round robin, and a pShift cluster runs the token
/// scheduler whatever a server names: either would run something other than the file (or the command
/// line's `--scheduler`, [`Scenario::with_scheduler`]) says.
fn check_schedulers(pshift: bool, servers: &[Server]) -> Result<(), ServerError> {
    for s in servers {
        let fault = match (pshift, s.scheduler == SchedulerKind::Token) {
            (false, true) => ServerFault::TokenWithoutPshift,
            (true, false) => ServerFault::NotTokenInPshift { scheduler: s.scheduler },
            _ => continue,
        };
        return Err(ServerError::new(&s.name, fault));
    }
    Ok(())
}

/// The requests the open loops have on the network at once, about: each tenant's requests issued within
/// one delay `net` ([`rein_model::WorkloadKind::issued_within`]: a closed loop's window bounds its own,
/// and a PARDA VM's wait at its host for room in the window), summed, at most [`MAX_NETWORK_IN_FLIGHT`].
/// Nothing bounded them: an open loop at 10^7 IOPS behind a 10 s delay held 10^8 requests in memory.
/// The error names the tenant with the most.
fn check_network(net: Nanos, tenants: &[Tenant]) -> Result<(), ModelError> {
    if net == Nanos::ZERO {
        return Ok(());
    }
    let each =
        tenants.iter().filter(|t| t.host.is_none()).filter_map(|t| t.workload.kind.issued_within(net).map(|n| (t, n)));
    let (mut total, mut most) = (0.0, None::<(&Tenant, f64)>);
    for (t, n) in each {
        total += n;
        if most.is_none_or(|(_, m)| n > m) {
            most = Some((t, n));
        }
    }
    match most {
        Some((t, n)) if total > MAX_NETWORK_IN_FLIGHT => Err(ModelError::NetworkInFlight {
            delay_ms: net.as_secs_f64() * 1e3,
            requests: total.round(),
            tenant: t.name.clone(),
            tenant_requests: n.round(),
            max: MAX_NETWORK_IN_FLIGHT,
        }),
        _ => Ok(()),
    }
}

impl ScenarioFile {
    /// Validates the file into a [`Scenario`] (trace paths relative to `base`).
    /// Errors name the scenario by its name; [`ScenarioFile::validate_as`] names its file.
    pub fn validate(self, base: Option<&Path>) -> Result<Scenario, ScenarioError> {
        let label = label(None, &self.name);
        self.validate_as(base, label)
    }

    /// [`ScenarioFile::validate`] with errors naming the scenario as `label` ([`Scenario::label`]).
    pub fn validate_as(self, base: Option<&Path>, label: String) -> Result<Scenario, ScenarioError> {
        validate(self, base).map_err(|error| ScenarioError::Invalid { scenario: label, error })
    }

    /// Validates the file read from `path` (trace paths relative to its directory, errors naming it) into a
    /// [`Scenario`] that knows it came from there ([`Scenario::path`]): what [`Scenario::load`] does, for a
    /// file changed between reading and validating (`rein pshift sweep`).
    pub fn validate_at(self, path: &Path) -> Result<Scenario, ScenarioError> {
        let mut sc = self.validate_as(path.parent(), path.display().to_string())?;
        sc.path = Some(path.to_path_buf());
        Ok(sc)
    }
}

fn validate(file: ScenarioFile, base: Option<&Path>) -> Result<Scenario, ModelError> {
    if file.name.trim().is_empty() {
        return Err(ModelError::EmptyName);
    }
    // The name heads the summary, the plots and summary.json's "name".
    no_control(&file.name)?;
    // One message for every value out of range, zero and negative alike.
    let duration = secs("duration_s", file.duration_s)
        .ok()
        .filter(|&d| d > Nanos::ZERO)
        .ok_or(ModelError::Duration { max: MAX_DURATION_S, got: file.duration_s })?;
    let warmup = secs("warmup_s", file.warmup_s)?;
    if warmup >= duration {
        return Err(ModelError::Warmup { warmup_s: file.warmup_s, duration_s: file.duration_s });
    }
    let interval = secs("interval_s", file.interval_s.unwrap_or(1.0))?;
    if interval < Nanos::from_millis(1) {
        return Err(ModelError::IntervalTooShort);
    }
    if (duration.0 / interval.0) as usize > MAX_INTERVALS {
        return Err(ModelError::TooManyIntervals { max: MAX_INTERVALS });
    }
    if interval > duration {
        return Err(ModelError::IntervalAboveDuration {
            interval_s: interval.as_secs_f64(),
            duration_s: file.duration_s,
        });
    }
    // `cost_model` at the top is a shorthand for `[mclock] cost_model`; one of the two.
    let settings = with_cost_model_shorthand(file.mclock.as_ref(), file.cost_model.as_ref())
        .map_err(ModelError::CostModelTwice)?;
    let sched = settings.resolve().map_err(ModelError::Sched)?;
    let net = file.network.delay_ms;
    if !net.is_finite() || !(0.0..=10_000.0).contains(&net) {
        return Err(ModelError::NetworkDelay { got: net });
    }
    // A pShift cluster's servers run its token scheduler; any other scenario's mClock unless it says.
    let fallback = if file.pshift.is_some() { "token" } else { "mclock" };
    let default_sched: NamedScheduler =
        file.scheduler.as_deref().unwrap_or(fallback).parse().map_err(ModelError::Scheduler)?;
    if file.servers.is_empty() {
        return Err(ModelError::NoServers);
    }
    if file.servers.len() > MAX_SERVERS {
        return Err(ModelError::TooManyServers { max: MAX_SERVERS });
    }
    if file.tenants.is_empty() && file.pshift.is_none() {
        return Err(ModelError::NoTenants);
    }
    if file.tenants.len() > MAX_TENANTS {
        return Err(ModelError::TooManyTenants { max: MAX_TENANTS });
    }
    let mut servers = Vec::with_capacity(file.servers.len());
    for (i, s) in file.servers.iter().enumerate() {
        servers.push(server::validate_server(i, s, &default_sched, &settings).map_err(ModelError::Server)?);
        // A step at or after the end would change nothing the run sees.
        if let Some(step) = s.capacity_schedule.iter().find(|c| c.at_s >= file.duration_s) {
            let fault = ServerFault::StepAfterEnd { at_s: step.at_s, duration_s: file.duration_s };
            return Err(ModelError::Server(ServerError::new(&s.name, fault)));
        }
    }
    check_unique(servers.iter().map(|s| s.name.as_str()), "server").map_err(ModelError::Name)?;
    // pShift's token scheduler takes only the cost model of the [mclock] settings: the rest would be
    // ignored.
    if file.pshift.is_some() {
        let only_cost =
            |m: &SchedSettingsFile| *m == SchedSettingsFile { cost_model: m.cost_model.clone(), ..Default::default() };
        if file.mclock.as_ref().is_some_and(|m| !only_cost(m)) {
            return Err(ModelError::MclockInPshift);
        }
        for f in &file.servers {
            let own = f.mclock.as_ref().is_some_and(|m| *m != SchedSettingsFile::default())
                || f.limit_mode.is_some()
                || f.batch.is_some()
                || f.batch_distance_kb.is_some();
            if own {
                return Err(ModelError::Server(ServerError::new(&f.name, ServerFault::MclockInPshift)));
            }
        }
    }
    check_schedulers(file.pshift.is_some(), &servers).map_err(ModelError::Server)?;
    let mut tenants = Vec::with_capacity(file.tenants.len());
    // Tenants naming one trace share its records; all the scenario's together are bounded.
    let mut traces = rein_model::workload::TraceCache::new();
    for (i, t) in file.tenants.iter().enumerate() {
        tenants.push(tenant::validate_tenant(i, t, &servers, base, duration, &mut traces).map_err(ModelError::Tenant)?);
    }
    if file.pshift.is_some() && (file.parda.is_some() || !file.hosts.is_empty()) {
        return Err(ModelError::PardaAndPshift);
    }
    let pshift = match &file.pshift {
        None => None,
        Some(p) => {
            let (section, all) =
                pshift::validate(p, &servers, tenants, file.seed, duration, interval).map_err(ModelError::Pshift)?;
            tenants = all;
            Some(Arc::new(section))
        }
    };
    check_unique(tenants.iter().map(|t| t.name.as_str()), "tenant").map_err(ModelError::Name)?;
    check_size(tenants.iter().map(|t| t.servers.len()).sum(), tenants.len(), servers.len())?;
    let (parda, hosts) =
        parda::validate(file.parda.as_ref(), &file.hosts, &file.tenants, &mut tenants, &servers, duration)
            .map_err(|e| ModelError::Parda(Box::new(e)))?;
    check_timeseries(duration, interval, tenants.len(), servers.len(), hosts.len())?;
    // pShift's buckets do not cross the network (the cluster layer drives them).
    if file.pshift.is_none() {
        check_network(Nanos::from_secs_f64(net / 1e3), &tenants)?;
    }
    let expect = file
        .expect
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let periods = match &pshift {
                Some(p) => expect::Periods::Pshift { controller: p.controller },
                None => expect::Periods::None,
            };
            let run = expect::RunLength {
                duration_s: file.duration_s,
                warmup_s: file.warmup_s,
                interval_s: interval.as_secs_f64(),
            };
            expect::validate(i, e, &tenants, &servers, &hosts, periods, run)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(ModelError::Expect)?;
    Ok(Scenario {
        name: file.name,
        path: None,
        sabotage: None,
        description: file.description,
        duration,
        warmup,
        seed: file.seed,
        interval,
        sched,
        net_delay: Nanos::from_secs_f64(net / 1e3),
        servers,
        tenants,
        expect,
        scheduler_name: default_sched.name().to_string(),
        parda,
        hosts,
        pshift,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_bounds_hold_at_their_edges() {
        assert!(check_size(MAX_PAIRS, 1, 1).is_ok());
        let e = check_size(20_000 * 1024, 20_000, 1024).unwrap_err();
        assert!(matches!(e, ModelError::TooManyPairs { pairs: 20_480_000, max: MAX_PAIRS }), "{e:?}");
        assert!(e.to_string().starts_with("20480000 tenant-server pairs"), "{e}");
        assert!(check_size(MAX_PAIRS + 1, 1, 1).is_err());
        // A million tenants on 1,024 servers, one server each: few pairs, a dense count per server.
        let e = check_size(1_000_000, 1_000_000, 1024).unwrap_err();
        assert!(
            matches!(e, ModelError::TenantsXServers { tenants: 1_000_000, servers: 1024, max: MAX_TENANTS_X_SERVERS }),
            "{e:?}"
        );
        assert!(e.to_string().contains("1000000 tenants x 1024 servers exceed"), "{e}");
        assert!(check_size(1_000_000, 1_000_000, 100).is_ok());
    }

    const BASE: &str = "name = \"t\"\nduration_s = 10\n[[servers]]\nname = \"s\"\ncapacity_iops = 100\n\
                        [[tenants]]\nname = \"a\"\n[tenants.workload]\nkind = \"closed\"\n";

    /// The error of `BASE` with `from` replaced by `to`, with the scenario it names.
    fn refused(from: &str, to: &str) -> (String, ModelError) {
        assert!(BASE.contains(from), "{from}");
        match Scenario::from_toml(&BASE.replacen(from, to, 1), None).unwrap_err() {
            ScenarioError::Invalid { scenario, error } => (scenario, error),
            e => panic!("not a model error: {e}"),
        }
    }

    /// A scenario of `tenants` closed loops on one server over 1,000 s in 1 ms intervals (10^6 of them,
    /// [`MAX_INTERVALS`]); with `hosts`, PARDA hosts, each with its share of the tenants as VMs.
    fn at_a_million_intervals(tenants: usize, hosts: usize) -> String {
        let mut s = String::from("name = \"m\"\nduration_s = 1000\ninterval_s = 0.001\n");
        if hosts > 0 {
            s.push_str("[parda]\nlatency_threshold_ms = 30\n");
        }
        s.push_str("[[servers]]\nname = \"s\"\ncapacity_iops = 100\n");
        for h in 0..hosts {
            s.push_str(&format!("[[hosts]]\nname = \"h{h}\"\n"));
        }
        for t in 0..tenants {
            let host = if hosts > 0 { format!("host = \"h{}\"\n", t % hosts) } else { String::new() };
            s.push_str(&format!("[[tenants]]\nname = \"t{t}\"\n{host}[tenants.workload]\nkind = \"closed\"\n"));
        }
        s
    }

    /// The run's timeseries keeps (tenants + servers) x intervals cells and its hosts' hosts x intervals,
    /// each within [`rein_model::recorder::MAX_CELLS`]: a file asking for more is refused when it is
    /// loaded, naming the numbers, not when its run sets up (after building its servers and tenants).
    /// Validation counts the cells, it does not allocate them: the scenario at the bound loads at once.
    #[test]
    fn the_timeseries_cells_are_bounded_at_load() {
        let max = rein_model::recorder::MAX_CELLS;
        // (49 tenants + 1 server) x 10^6 intervals: exactly the bound.
        let sc = Scenario::from_toml(&at_a_million_intervals(49, 0), None).unwrap();
        assert_eq!(
            (sc.tenants.len() + sc.servers.len()) * rein_model::recorder::intervals(sc.duration, sc.interval),
            max
        );
        let e = Scenario::from_toml(&at_a_million_intervals(50, 0), None).unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Invalid { error: ModelError::Timeseries { cells, .. }, .. }
                if cells.tenants == 50 && cells.servers == 1 && cells.intervals == 1_000_000),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "scenario \"m\": duration_s 1000 / interval_s 0.001 = 1000000 intervals: (50 tenants + 1 servers) x \
                 1000000 intervals exceeds {max} timeseries cells: raise interval_s"
            )
        );
        // 51 hosts (a VM each) x 10^6 intervals: the hosts' cells are named, though the tenants' exceed the
        // bound too (every host has a VM, so hosts x intervals stays under the tenants' cells).
        let e = Scenario::from_toml(&at_a_million_intervals(51, 51), None).unwrap_err();
        assert!(
            matches!(&e, ScenarioError::Invalid { error: ModelError::HostTimeseries { cells, .. }, .. }
                if cells.hosts == 51 && cells.intervals == 1_000_000 && cells.max == max),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "scenario \"m\": duration_s 1000 / interval_s 0.001 = 1000000 intervals: 51 hosts x 1000000 \
                 intervals exceeds {max} host timeseries cells: raise interval_s"
            )
        );
        // 49 VMs on 7 hosts: within both bounds.
        let sc = Scenario::from_toml(&at_a_million_intervals(49, 7), None).unwrap();
        assert_eq!(sc.hosts.len(), 7);
    }

    #[test]
    fn errors_are_typed_with_the_key_value_and_bound() {
        let (scenario, e) = refused("duration_s = 10", "duration_s = 10\nwarmup_s = 12");
        assert_eq!(scenario, "\"t\"");
        assert!(matches!(e, ModelError::Warmup { warmup_s: 12.0, duration_s: 10.0 }), "{e:?}");
        let (_, e) = refused("duration_s = 10", "duration_s = -1");
        assert!(matches!(e, ModelError::Duration { max: MAX_DURATION_S, got: -1.0 }), "{e:?}");
        let (_, e) = refused("duration_s = 10", "duration_s = 10\ninterval_s = 1e9");
        assert!(matches!(e, ModelError::Seconds { key: "interval_s", max: MAX_DURATION_S, got: 1e9 }), "{e:?}");
        let two = "kind = \"closed\"\n[[tenants]]\nname = \"a\"\n[tenants.workload]\nkind = \"closed\"";
        let (_, e) = refused("kind = \"closed\"", two);
        assert!(matches!(&e, ModelError::Name(NameError::Repeated { what: "tenant", name }) if name == "a"), "{e:?}");
        let (_, e) = refused("name = \"t\"", "name = \"t\\n\"");
        assert!(matches!(&e, ModelError::ControlCharacter { text } if text == "t\n"), "{e:?}");
        let (_, e) = refused("capacity_iops = 100", "capacity_iops = 100\nscheduler = \"token\"");
        assert!(
            matches!(&e, ModelError::Server(ServerError { server, fault: ServerFault::TokenWithoutPshift }) if server == "s"),
            "{e:?}"
        );
        let (_, e) = refused("kind = \"closed\"", "kind = \"closed\"\n[network]\ndelay_ms = 20000");
        assert!(matches!(e, ModelError::NetworkDelay { got: 20_000.0 }), "{e:?}");
        let (_, e) = refused("name = \"a\"", "name = \"a\"\nservers = [\"x\"]");
        assert!(
            matches!(&e, ModelError::Tenant(TenantError { tenant, fault: TenantFault::UnknownServer { server } })
            if tenant == "a" && server == "x"),
            "{e:?}"
        );
        // The message is the scenario's, then the field's, once each.
        let text = BASE.replacen("name = \"a\"", "name = \"a\"\nservers = [\"x\"]", 1);
        let message = Scenario::from_toml(&text, None).unwrap_err().to_string();
        assert_eq!(message, "scenario \"t\": tenant a: unknown server \"x\"");
    }

    /// `rein sim --scheduler NAME`'s copy: every server on the scheduler NAME names, reported under NAME as
    /// given; one the scenario's section does not allow refused and nothing kept (a name that is none is
    /// refused where it is parsed, [`NamedScheduler`]).
    #[test]
    fn a_named_scheduler_runs_everywhere_under_its_name() {
        let sc = Scenario::from_toml(BASE, None).unwrap();
        let named = |name: &str| name.parse::<NamedScheduler>().unwrap();
        let s = sc.with_scheduler_named(&named("LFQ")).unwrap();
        assert_eq!(s.scheduler_name(), "LFQ");
        assert!(s.servers().iter().all(|srv| srv.scheduler == SchedulerKind::Sfq && !srv.distributed));
        assert_eq!(sc.scheduler_name(), "mclock", "the original is unchanged");
        let e = sc.with_scheduler_named(&named("token")).unwrap_err();
        assert!(
            matches!(
                &e,
                ScenarioError::Invalid {
                    error: ModelError::Server(ServerError { fault: ServerFault::TokenWithoutPshift, .. }),
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// A file validated at its path knows it (errors and reports name it); text given directly does not.
    #[test]
    fn a_file_validated_at_its_path_is_named_by_it() {
        let at = Path::new("dir/t.toml");
        let sc = ScenarioFile::parse(BASE).unwrap().validate_at(at).unwrap();
        assert_eq!((sc.path(), sc.label()), (Some(at), "dir/t.toml".to_string()));
        let e = ScenarioFile::parse(&BASE.replace("duration_s = 10", "duration_s = 0")).unwrap().validate_at(at);
        assert!(e.unwrap_err().to_string().starts_with("scenario dir/t.toml: duration_s"));
        assert_eq!(Scenario::from_toml(BASE, None).unwrap().path(), None);
    }
}
