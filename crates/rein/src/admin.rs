//! `rein admin`: a running daemon asked and changed through its admin endpoint, so that an operator need
//! not write the API's JSON and headers by hand. Of `rein serve`: its tenants (a table of each one's spec
//! and what it gets now), a tenant's spec changed, tenants added and removed, its exports, the capacity
//! admission control uses. Of `rein gateway`: its node links, and its PARDA host. Of `rein pshift
//! controller`: its buckets and servers. The same endpoint options as `rein load --admin` (a token file,
//! HTTPS with a CA and a client certificate); `--json` prints the endpoint's own answer instead.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rein_runtime::admin::TenantJson;
use rein_runtime::admin_client::{self, AdminEndpoint, AdminEndpointError};
use rein_runtime::admin_guard::AdminToken;
use rein_runtime::parda_host::HostStatus;
use rein_runtime::prom::Sample;
use rein_runtime::pshift_controller::ControllerStatus;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// The server's admin endpoint, as ADDR or http://ADDR, or https://ADDR when it is served with
    /// admin_tls (default 127.0.0.1:9180, rein serve's).
    #[arg(long)]
    admin: Option<String>,
    /// The daemon's own configuration file (rein serve's, rein gateway's or the pShift controller's):
    /// its `admin` address (a wildcard one asked on loopback), `admin_token_file` and `admin_tls` are
    /// used, so that on the daemon's host no other option is needed (under admin_tls, --admin-ca too
    /// unless the certificate chains to the system's roots).
    #[arg(long, conflicts_with = "admin")]
    config: Option<PathBuf>,
    #[command(flatten)]
    client: AdminClientArgs,
    /// Print the endpoint's JSON answer instead of a table or a line.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: AdminCmd,
}

#[derive(Debug, Subcommand)]
enum AdminCmd {
    /// The tenants: each one's reservation, limit and weight, and what it gets now (IOPS in the last
    /// second, queued requests, mean latency, seconds below its reservation).
    Tenants {
        /// Read the tenants again every SECONDS (0.1 to 3600) and print the table each time, until
        /// interrupted (or --count tables).
        #[arg(long, value_name = "SECONDS")]
        watch: Option<f64>,
        /// With --watch: stop after this many tables.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// Change a tenant's spec; what is not given stays as it is. Applies at once, and persists.
    Set(SetArgs),
    /// Add a tenant (reservation 0, no limit, weight 1 unless given).
    Add(SpecArgs),
    /// Remove a tenant (refused while an export belongs to it).
    Remove {
        /// The tenant.
        #[arg(value_parser = name)]
        tenant: String,
    },
    /// The exports: name, tenant, size and whether read-only.
    Exports,
    /// Add an export, seen by new connections at once (a file under the data directory, created when
    /// --size-mb is given; or RAM with --memory).
    AddExport(AddExportArgs),
    /// Remove an export: new connections no longer see it; open ones keep it until they close.
    RemoveExport {
        /// The export.
        #[arg(value_parser = name)]
        export: String,
    },
    /// The capacity admission control uses, and the reservations against it; with IOPS, set it.
    Capacity {
        /// The new capacity (IOPS), replacing the configured, probed or modelled one.
        #[arg(value_parser = finite)]
        iops: Option<f64>,
    },
    /// rein gateway: each volume's node links (up, in flight, pieces, failures).
    Nodes,
    /// rein gateway with `[parda]`: the PARDA host (window, latency signal, beta, hosts seen).
    Parda,
    /// rein pshift controller: its buckets (bounds, this period, missed periods) and servers.
    Buckets,
    /// Any daemon: what it is, how long it has run, its last reload, connections, stalls, certificates,
    /// and its own part (tenants, node links, servers), from its /metrics. Exits 1, naming them, when
    /// something needs attention (a refused reload, settings waiting for a restart, a certificate within
    /// 14 days of expiry, a node link down); an answer without a rein_ series is no daemon's scrape,
    /// and an error.
    Status,
}

#[derive(Debug, Args)]
struct SpecArgs {
    /// The tenant.
    #[arg(value_parser = name)]
    tenant: String,
    /// Reservation (IOPS, or cost units per second under a cost model).
    #[arg(long, value_parser = finite)]
    reservation: Option<f64>,
    /// Limit (IOPS).
    #[arg(long, value_parser = finite)]
    limit: Option<f64>,
    /// Weight (its share of what is left over the reservations).
    #[arg(long, value_parser = finite)]
    weight: Option<f64>,
    /// Idle credit (IOs of catching up a tenant gets back after an idle spell).
    #[arg(long)]
    idle_credit: Option<u32>,
}

#[derive(Debug, Args)]
struct AddExportArgs {
    /// The export's name, as clients ask for it.
    #[arg(value_parser = name)]
    export: String,
    /// The tenant whose QoS it gets (default: a tenant of the export's name, which must exist).
    #[arg(long)]
    tenant: Option<String>,
    /// The image's size (MiB): the file is created with it if missing; a memory export's size.
    #[arg(long)]
    size_mb: Option<u64>,
    /// The image file, relative to the data directory (default: EXPORT.img).
    #[arg(long, conflicts_with = "memory")]
    path: Option<String>,
    /// A RAM export (zeroes, gone when the server stops) instead of a file.
    #[arg(long)]
    memory: bool,
    /// Serve it read-only (an existing file is never created).
    #[arg(long)]
    read_only: bool,
    /// O_DIRECT file IO (bypasses the page cache).
    #[arg(long, conflicts_with = "memory")]
    direct: bool,
}

impl AddExportArgs {
    /// `POST /api/exports`'s body: rein.toml's `[[exports]]` fields, the omitted ones left to the server.
    fn body(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("name".into(), json!(self.export));
        m.insert("backend".into(), json!(if self.memory { "memory" } else { "file" }));
        if let Some(t) = &self.tenant {
            m.insert("tenant".into(), json!(t));
        }
        if let Some(n) = self.size_mb {
            m.insert("size_mb".into(), json!(n));
        }
        if let Some(p) = &self.path {
            m.insert("path".into(), json!(p));
        }
        m.insert("read_only".into(), json!(self.read_only));
        m.insert("direct".into(), json!(self.direct));
        Value::Object(m)
    }
}

#[derive(Debug, Args)]
struct SetArgs {
    #[command(flatten)]
    spec: SpecArgs,
    /// Remove the tenant's limit.
    #[arg(long, conflicts_with = "limit")]
    no_limit: bool,
}

impl AdminCmd {
    /// The daemon whose endpoint answers this command.
    fn daemon(&self) -> &'static str {
        match self {
            AdminCmd::Nodes => "a rein gateway",
            AdminCmd::Parda => "a rein gateway with [parda]",
            AdminCmd::Buckets => "a rein pshift controller",
            _ => "a rein serve",
        }
    }
}

impl SpecArgs {
    /// The JSON fields given (omitted ones absent, so that a PUT keeps them).
    fn fields(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("reservation", self.reservation.map(Value::from));
        put("limit", self.limit.map(Value::from));
        put("weight", self.weight.map(Value::from));
        put("idle_credit", self.idle_credit.map(Value::from));
        m
    }
}

/// A number of `--reservation`, `--limit`, `--weight` or `capacity`: finite, since JSON has no NaN or
/// infinity (serde_json writes them as `null`, which the endpoint reads as "no limit" or "unchanged").
fn finite(text: &str) -> Result<f64, String> {
    let v: f64 = text.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{text} is not a finite number (no limit: --no-limit)"))
    }
}

/// A tenant's or an export's name: not empty (an empty one would ask for the collection, and be
/// answered as another daemon's command). The endpoint says what else it refuses.
fn name(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("a name cannot be empty".into());
    }
    Ok(text.to_string())
}

/// A tenant's name as one segment of the API's path.
fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Whose configuration file `--config` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Daemon {
    Serve,
    Gateway,
    PshiftController,
}

/// Which daemon's configuration `text` is, by the tables only that daemon has: a gateway's `[[nodes]]`,
/// the pShift controller's `[[buckets]]`; anything else is rein serve's (whose parser then says what is
/// wrong with it).
fn daemon_of(text: &str, path: &std::path::Path) -> Result<Daemon> {
    let table: toml::Table = toml::from_str(text).with_context(|| format!("{}: not TOML", path.display()))?;
    Ok(if table.contains_key("nodes") {
        Daemon::Gateway
    } else if table.contains_key("buckets") {
        Daemon::PshiftController
    } else {
        Daemon::Serve
    })
}

/// `--config FILE`: the admin endpoint (`https://` under `admin_tls`) and token file a daemon's
/// configuration names. A wildcard address (`0.0.0.0`, `[::]`) is asked on loopback.
fn endpoint_of_config(path: &std::path::Path) -> Result<(String, Option<PathBuf>)> {
    // As the daemons read it: a FIFO without a writer refused at once (not waited on for ever), and at most
    // their bound of bytes (not an endless file read whole into memory).
    let text = rein_runtime::durable::read_config(path, rein_runtime::config::MAX_CONFIG_BYTES)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let (admin, token, https) = match daemon_of(&text, path)? {
        Daemon::Gateway => {
            let c = rein_runtime::gateway::GatewayConfig::parse(&text, path)?;
            (c.admin, c.admin_access.token_file, false)
        }
        Daemon::PshiftController => {
            let c = rein_runtime::pshift_controller::ControllerSettings::parse(&text, path)?;
            (c.admin, c.admin_access.token_file, false)
        }
        Daemon::Serve => {
            let c = rein_runtime::config::ServerConfig::parse(&text, path)?;
            (Some(c.admin), c.admin_access.token_file, c.admin_tls.is_some())
        }
    };
    let Some(mut admin) = admin else {
        bail!("{} names no admin endpoint (`admin = \"ADDR:PORT\"`): there is nothing to ask", path.display())
    };
    if admin.ip().is_unspecified() {
        admin.set_ip(if admin.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
    }
    Ok((if https { format!("https://{admin}") } else { admin.to_string() }, token))
}

/// How to reach an admin endpoint besides its address: the HTTPS trust, a client certificate and the
/// bearer token (`rein admin`'s, and `rein load --admin`'s).
#[derive(Debug, Args)]
pub(crate) struct AdminClientArgs {
    /// For an https:// admin endpoint: the CA certificates (PEM) its certificate must chain to (default:
    /// the system's).
    #[arg(long)]
    admin_ca: Option<PathBuf>,
    /// For an https:// admin endpoint that asks for client certificates (`[tls] ca`): this certificate
    /// (PEM), with --admin-key.
    #[arg(long, requires = "admin_key")]
    admin_cert: Option<PathBuf>,
    /// The private key (PEM) of --admin-cert.
    #[arg(long, requires = "admin_cert")]
    admin_key: Option<PathBuf>,
    /// The admin endpoint's bearer token file (the daemon's `admin_token_file`), sent with every request.
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
}

impl AdminClientArgs {
    /// The options' ids, for a command that takes them only beside its own `--admin`.
    pub(crate) const IDS: [&'static str; 4] = ["admin_ca", "admin_cert", "admin_key", "admin_token_file"];

    /// The endpoint at `address` (ADDR, http://ADDR or https://ADDR) with these options.
    pub(crate) fn endpoint(&self, address: &str) -> Result<AdminEndpoint, AdminEndpointError> {
        let cert = self.admin_cert.as_deref().zip(self.admin_key.as_deref());
        AdminEndpoint::parse_with(address, self.admin_ca.as_deref(), cert)
    }

    /// The token of --admin-token-file, or else of `fallback` (the one a daemon's own file names).
    pub(crate) fn token(&self, fallback: Option<PathBuf>) -> Result<Option<AdminToken>> {
        let file = self.admin_token_file.clone().or(fallback);
        Ok(file.as_deref().map(AdminToken::load).transpose()?)
    }
}

pub(crate) fn run(args: AdminArgs) -> Result<()> {
    let (address, config_token, source) = match &args.config {
        Some(path) => {
            let (address, token) = endpoint_of_config(path)?;
            (address, token, format!("the admin endpoint of {}", path.display()))
        }
        None => (args.admin.clone().unwrap_or_else(|| "127.0.0.1:9180".to_string()), None, "--admin".to_string()),
    };
    // The endpoint's errors name `--admin` and the value given themselves: said again in front, they
    // read `--admin foo: --admin "foo": ...`. An address from a daemon's file says which file.
    let endpoint = args.client.endpoint(&address).map_err(|e| match &args.config {
        None => anyhow::Error::from(e),
        Some(_) => anyhow::anyhow!("{source} {address}: {e}"),
    })?;
    let token = args.client.token(config_token)?;
    let (method, path, body) = match &args.cmd {
        AdminCmd::Tenants { .. } => ("GET", "/api/tenants".to_string(), None),
        AdminCmd::Set(s) => {
            let mut fields = s.spec.fields();
            if s.no_limit {
                fields.insert("limit".into(), Value::Null);
            }
            if fields.is_empty() {
                bail!("nothing to change: give --reservation, --limit, --no-limit, --weight or --idle-credit");
            }
            ("PUT", format!("/api/tenants/{}", segment(&s.spec.tenant)), Some(Value::Object(fields)))
        }
        AdminCmd::Add(s) => {
            let mut fields = s.fields();
            fields.insert("name".into(), json!(s.tenant));
            ("POST", "/api/tenants".to_string(), Some(Value::Object(fields)))
        }
        AdminCmd::Remove { tenant } => ("DELETE", format!("/api/tenants/{}", segment(tenant)), None),
        AdminCmd::Exports => ("GET", "/api/exports".to_string(), None),
        AdminCmd::AddExport(e) => ("POST", "/api/exports".to_string(), Some(e.body())),
        AdminCmd::RemoveExport { export } => ("DELETE", format!("/api/exports/{}", segment(export)), None),
        AdminCmd::Capacity { iops: None } => ("GET", "/api/capacity".to_string(), None),
        AdminCmd::Capacity { iops: Some(iops) } => ("PUT", "/api/capacity".to_string(), Some(json!({ "iops": iops }))),
        AdminCmd::Nodes => ("GET", "/api/nodes".to_string(), None),
        AdminCmd::Parda => ("GET", "/api/parda".to_string(), None),
        AdminCmd::Buckets => ("GET", "/api/pshift".to_string(), None),
        AdminCmd::Status => ("GET", "/metrics".to_string(), None),
    };
    let (every, count) = match args.cmd {
        AdminCmd::Tenants { watch: Some(s), count } => {
            if !(0.1..=3600.0).contains(&s) {
                bail!("--watch {s} is out of range: 0.1 to 3600 seconds");
            }
            (Some(std::time::Duration::from_secs_f64(s)), count.unwrap_or(u64::MAX))
        }
        _ => (None, 1),
    };
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    let started = std::time::Instant::now();
    for n in 0..count {
        if let Some(every) = every {
            if n > 0 {
                // The reader may go while the watch waits (`| head -3` after the first table): seen
                // within a tenth of a second, not at the next write, a period (up to an hour) later.
                if sleep_unless_closed(every) {
                    break;
                }
                if !args.json {
                    outln!();
                }
            }
            // Under --json each answer is one line of its own (JSON lines, for jq), without this one.
            if !args.json {
                outln!("at {:.1} s:", started.elapsed().as_secs_f64());
            }
        }
        let call = async {
            match &args.cmd {
                // The scrape is text: carried to `show` as a JSON string.
                AdminCmd::Status => {
                    admin_client::get_text(&endpoint, token.as_ref(), &path).await.map(|t| Some(Value::String(t)))
                }
                _ => admin_client::send_json(&endpoint, token.as_ref(), method, &path, body.as_ref()).await,
            }
        };
        let answer = match rt.block_on(call) {
            Ok(a) => a,
            // A path the daemon does not serve at all (axum's bare 404): the command is another daemon's.
            Err(admin_client::AdminClientError::Status { status: 404, body, .. }) if body.is_empty() => bail!(
                "admin endpoint {}: no {path} there: this command asks {}'s admin endpoint",
                endpoint.addr,
                args.cmd.daemon()
            ),
            // Nothing listens there: say what to check, not only the errno.
            Err(admin_client::AdminClientError::Io { addr, source: io })
                if io.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                bail!(
                    "admin endpoint {addr}: {io}: nothing listens there (is the daemon running, with its admin \
                     endpoint at this address? --admin ADDR or --config FILE names it; without either, rein \
                     serve's default 127.0.0.1:9180)"
                )
            }
            Err(e) => return Err(e.into()),
        };
        show(&args, endpoint.addr, answer, every.is_some())?;
        // A watch whose reader has gone (`rein admin tenants --watch 1 | head`) stops, as the other
        // commands whose output is their only product do (stdout.rs).
        if crate::stdout::closed() {
            break;
        }
    }
    Ok(())
}

/// Sleeps `d`, or until stdout's reader has gone (polled every 100 ms); returns whether it has.
fn sleep_unless_closed(d: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + d;
    loop {
        if crate::stdout::closed() {
            return true;
        }
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(100)));
    }
}

/// The endpoint's JSON with every string [`admin_client::printable`], for the tables and lines (an
/// endpoint's name cannot carry an escape sequence to the terminal; `--json` escapes them as JSON does).
fn printable(v: &mut Value) {
    match v {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(p) = admin_client::printable(s) {
                *s = p;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(printable),
        Value::Object(m) => m.values_mut().for_each(printable),
        _ => {}
    }
}

/// Prints `answer` to `args`'s command: the endpoint's JSON under `--json` (on one line when `watching`),
/// else a table or a line. `status` reads the scrape (`answer` as a string) and fails, naming them, when
/// something needs attention.
fn show(args: &AdminArgs, addr: std::net::SocketAddr, answer: Option<Value>, watching: bool) -> Result<()> {
    if let AdminCmd::Status = args.cmd {
        let text = answer.as_ref().and_then(Value::as_str).unwrap_or_default();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let samples = rein_runtime::prom::samples(&admin_client::printable(text));
        // A health check must not pass on a page that is no daemon's scrape (another service's on that
        // port, a proxy's login page, an empty answer): a rein daemon's has its own series.
        if !samples.iter().any(|s| s.name.starts_with("rein_")) {
            bail!(
                "admin endpoint {}: its /metrics has no rein_ series ({} bytes): not a rein daemon's scrape",
                addr,
                text.len()
            );
        }
        let (lines, attention) = status_lines(&samples, now);
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&json!({ "status": lines, "attention": attention }))?);
        } else {
            for l in &lines {
                outln!("{l}");
            }
        }
        if !attention.is_empty() {
            bail!("needs attention: {}", attention.join("; "));
        }
        return Ok(());
    }
    if args.json {
        if let Some(v) = &answer {
            let text = if watching { serde_json::to_string(v)? } else { serde_json::to_string_pretty(v)? };
            outln!("{text}");
        }
        return Ok(());
    }
    let mut answer = answer.unwrap_or(Value::Null);
    printable(&mut answer);
    match &args.cmd {
        AdminCmd::Tenants { .. } => {
            let tenants: Vec<TenantJson> = serde_json::from_value(answer).context("the endpoint's tenants")?;
            out!("{}", tenants_table(&tenants));
        }
        AdminCmd::Set(_) | AdminCmd::Add(_) => {
            let verb = if matches!(args.cmd, AdminCmd::Add(_)) { "added" } else { "set" };
            outln!("{verb} {}", spec_line(&answer));
            if let Some(w) = answer["warning"].as_str() {
                outln!("warning: {w}");
            }
        }
        AdminCmd::Remove { tenant } => outln!("removed tenant {tenant}"),
        AdminCmd::Exports => out!("{}", exports_table(&answer)?),
        AdminCmd::AddExport(e) => outln!("added export {}", e.export),
        AdminCmd::RemoveExport { export } => {
            outln!("removed export {export} (connections open to it keep it until they close)")
        }
        AdminCmd::Capacity { iops: Some(_) } => {
            outln!("capacity {} IOPS", number(&answer["iops"]));
            if let Some(w) = answer["warning"].as_str() {
                outln!("warning: {w}");
            }
        }
        AdminCmd::Capacity { iops: None } => outln!("{}", capacity_line(&answer)),
        AdminCmd::Nodes => out!("{}", nodes_table(&answer)?),
        AdminCmd::Parda => {
            let h: HostStatus = serde_json::from_value(answer).context("the endpoint's PARDA host")?;
            out!("{}", parda_lines(&h));
        }
        AdminCmd::Status => {} // shown at the top, with its own JSON
        AdminCmd::Buckets => {
            let c: ControllerStatus = serde_json::from_value(answer).context("the endpoint's pShift controller")?;
            out!("{}", buckets_table(&c));
        }
    }
    Ok(())
}

/// `d` seconds as `3d 4h`, `2h 03m`, `5m 07s` or `42s`.
fn duration(d: f64) -> String {
    if d.is_nan() {
        return "an unknown time (not a number)".into();
    }
    let s = d.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// A daemon's state from its scrape `samples` at `now` (seconds since the Unix epoch): lines to print,
/// and what needs attention (each a phrase).
fn status_lines(samples: &[Sample], now: f64) -> (Vec<String>, Vec<String>) {
    let one = |name: &str| samples.iter().find(|s| s.name == name);
    let value = |name: &str| one(name).map(|s| s.value);
    let sum = |name: &str| {
        let v: Vec<f64> = samples.iter().filter(|s| s.name == name).map(|s| s.value).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>())
    };
    let labelled = |name: &str, key: &str, val: &str| {
        samples.iter().find(|s| s.name == name && s.label(key) == Some(val)).map_or(0.0, |s| s.value)
    };
    let (mut lines, mut attention) = (Vec::new(), Vec::new());
    let daemon = one("rein_build_info").map_or("a daemon of another build".to_string(), |b| {
        let name = match b.label("daemon") {
            Some("serve") => "rein serve",
            Some("gateway") => "rein gateway",
            Some("pshift_controller") => "rein pshift controller",
            Some(other) => other,
            None => "rein",
        };
        format!("{name} {}", b.label("version").unwrap_or("?"))
    });
    let up = value("rein_process_start_time_seconds").map_or(String::new(), |t| format!(", up {}", duration(now - t)));
    let sched = one("rein_scheduler_info").map_or(String::new(), |s| {
        format!(
            " (scheduler {}, io engine {})",
            s.label("scheduler").unwrap_or("?"),
            s.label("io_engine").unwrap_or("?")
        )
    });
    lines.push(format!("{daemon}{up}{sched}"));
    if let Some(ok) = value("rein_config_last_reload_successful") {
        let (applied, failed) = (
            labelled("rein_config_reloads_total", "result", "applied"),
            labelled("rein_config_reloads_total", "result", "failed"),
        );
        let pending = value("rein_config_restart_pending").unwrap_or(0.0);
        let last = if applied + failed == 0.0 {
            "no reload since the start"
        } else if ok == 1.0 {
            "the last reload applied"
        } else {
            "the last reload was REFUSED"
        };
        let waits = if pending > 0.0 {
            format!("{pending} setting(s) wait for a restart")
        } else {
            "nothing waits for a restart".to_string()
        };
        lines.push(format!("configuration: {last} ({applied} applied, {failed} failed); {waits}"));
        if ok != 1.0 {
            attention.push("the last reload was refused (the log says why)".to_string());
        }
        if pending > 0.0 {
            attention.push(format!("{pending} setting(s) of the file wait for a restart"));
        }
    }
    if let Some(open) = value("rein_nbd_connections") {
        let cap = value("rein_nbd_connections_max").map_or(String::new(), |c| format!(" (cap {c})"));
        lines.push(format!(
            "connections: {open} open{cap}; refused {}, failed handshakes {}, failed accepts {}",
            sum("rein_nbd_connections_refused_total").unwrap_or(0.0),
            value("rein_nbd_handshakes_failed_total").unwrap_or(0.0),
            value("rein_nbd_accepts_failed_total").unwrap_or(0.0)
        ));
    }
    if let Some(stalls) = value("rein_process_stalls_total") {
        let secs = value("rein_process_stalled_seconds_total").unwrap_or(0.0);
        lines.push(format!("process: {stalls} stalls of over a second, {secs:.1} s in all"));
    }
    for c in samples.iter().filter(|s| s.name == "rein_tls_certificate_expiration_timestamp_seconds") {
        let left = c.value - now;
        let what = c.label("use").unwrap_or("?");
        lines.push(format!("certificate {what}: expires in {}", duration(left)));
        // A value that is no time (NaN) needs a look as much as a near one.
        if left.is_nan() || left < 14.0 * 86400.0 {
            attention.push(format!("certificate {what} expires in {}", duration(left)));
        }
    }
    let tenants = samples.iter().filter(|s| s.name == "rein_tenant_reservation_iops").count();
    if let (Some(out), Some(depth)) = (value("rein_backend_outstanding"), value("rein_backend_queue_depth")) {
        lines.push(format!("tenants: {tenants}; backend: {out} of {depth} outstanding"));
    }
    if let (Some(up), Some(all)) = (sum("rein_gateway_node_connections_up"), sum("rein_gateway_node_connections")) {
        lines.push(format!("node links: {up} of {all} up"));
        if up.is_nan() || up < all {
            attention.push(format!("{} node link(s) down (rein admin nodes)", all - up));
        }
    }
    // A PARDA host with UDP peers: a cluster average without them all (a peer down, or its reports
    // refused: a wrong key or address) rests on fewer hosts than configured.
    if let (Some(hosts), Some(peers @ 1.0..)) = (value("rein_parda_cluster_hosts"), value("rein_parda_peers")) {
        let refused = value("rein_parda_records_refused_total").unwrap_or(0.0);
        lines.push(format!(
            "parda: {hosts} of {} hosts in the last cluster average; {refused} peer report(s) refused since the start",
            peers + 1.0
        ));
        // (A count that is no number needs a look too.)
        let short = hosts.is_nan() || hosts < peers + 1.0;
        if short && value("rein_parda_periods_total").unwrap_or(0.0) > 0.0 {
            attention.push(format!(
                "PARDA: {hosts} of {} hosts in the cluster average (a peer down, or its reports refused: the log \
                 says which; rein admin parda)",
                peers + 1.0
            ));
        }
    }
    if let Some(n) = value("rein_pshift_servers_connected") {
        let round = value("rein_pshift_round").unwrap_or(0.0);
        match value("rein_pshift_servers") {
            Some(all) => {
                lines.push(format!("pshift: {n} of {all} server(s) connected, round {round}"));
                // A server away is a server whose buckets get no tokens' worth of its share.
                if n.is_nan() || n < all {
                    attention.push(format!("{} pShift server(s) not connected (rein admin buckets)", all - n));
                }
            }
            // A controller of a build before the configured count.
            None => lines.push(format!("pshift: {n} server(s) connected, round {round}")),
        }
    }
    (lines, attention)
}

/// `GET /api/nodes`'s answer (a gateway's volumes, each with its node links) as a table.
fn nodes_table(v: &Value) -> Result<String> {
    let volumes = v.as_array().context("the endpoint's nodes: not a list")?;
    let mut rows = vec![[
        "EXPORT",
        "NODE",
        "ADDRESS",
        "PROTOCOL",
        "TLS",
        "UP",
        "IN_FLIGHT",
        "PIECES",
        "PIECE_ERRORS",
        "SESSIONS_LOST",
        "FLUSH_LOST",
    ]
    .map(String::from)];
    for vol in volumes {
        let mut export = vol["export"].as_str().unwrap_or("?").to_string();
        if vol["removed"].as_bool() == Some(true) {
            export.push_str(" (removed)");
        }
        // Advertised read-only to new connections: a node export refuses writes (docs/gateway.md).
        if vol["read_only"].as_bool() == Some(true) {
            export.push_str(" (read-only)");
        }
        for n in vol["nodes"].as_array().into_iter().flatten() {
            let text = |k: &str| n[k].as_str().map_or_else(|| number(&n[k]), str::to_string);
            rows.push([
                export.clone(),
                text("node"),
                text("address"),
                text("protocol"),
                n["tls"].as_bool().map_or("?", |t| if t { "yes" } else { "no" }).to_string(),
                format!("{}/{}", number(&n["connected"]), number(&n["connections"])),
                number(&n["in_flight"]),
                number(&n["pieces"]),
                number(&n["piece_errors"]),
                number(&n["sessions_lost"]),
                number(&n["flush_lost"]),
            ]);
        }
    }
    Ok(table(&rows))
}

/// A PARDA host's status in a few lines.
fn parda_lines(h: &HostStatus) -> String {
    let ms = |v: Option<f64>| v.map_or("none yet".to_string(), |x| format!("{x:.2} ms"));
    let mode = if h.controlled { format!("PARDA, {} aggregation", h.aggregation) } else { "a fixed queue".into() };
    let hosts = if h.cluster_hosts > 0 {
        format!(", {} hosts in the last cluster average", h.cluster_hosts)
    } else {
        String::new()
    };
    format!(
        "host {} ({mode}): window {:.2}, issue limit {}, beta {:.3} (base {:.3}), {} VMs\n\
         latency signal {}, own estimate {}{hosts}\n\
         outstanding {}, queued {}, completed {}, abandoned {}, periods {}\n\
         exchange errors {}, records refused {}, id conflicts {}\n",
        h.id,
        h.window,
        h.issue_limit,
        h.beta,
        h.beta_base,
        h.vms,
        ms(h.signal_ms),
        ms(h.estimate_ms),
        h.outstanding,
        h.queued,
        h.completed,
        h.abandoned,
        h.periods,
        h.exchange_errors,
        h.records_refused,
        h.id_conflicts,
    )
}

/// A pShift controller's servers in a line, then its buckets as a table.
fn buckets_table(c: &ControllerStatus) -> String {
    let up = c.servers.iter().filter(|s| s.1).count();
    let down: Vec<&str> = c.servers.iter().filter(|s| !s.1).map(|s| s.0.as_str()).collect();
    let mut s = format!("round {}, {up} of {} servers connected", c.round, c.servers.len());
    if !down.is_empty() {
        s.push_str(&format!(" (not: {})", down.join(", ")));
    }
    s.push_str(&format!(", reports late {}, refused {}\n", c.late_reports, c.refused));
    let mut rows = vec![[
        "BUCKET",
        "RESERVATION",
        "LIMIT",
        "DONE",
        "LAST_PERIOD",
        "PERIODS",
        "BELOW_RESV_WITH_DEMAND",
        "ABOVE_LIMIT",
        "INCOMPLETE",
    ]
    .map(String::from)];
    for b in &c.buckets {
        let p = &b.periods;
        rows.push([
            b.name.clone(),
            b.reservation.to_string(),
            b.limit.map_or("none".to_string(), |l| l.to_string()),
            b.done.to_string(),
            p.last.map_or("-".to_string(), |l| l.to_string()),
            p.closed.to_string(),
            p.below_reservation_with_demand.to_string(),
            p.above_limit.to_string(),
            p.incomplete.to_string(),
        ]);
    }
    s.push_str(&table(&rows));
    s
}

/// A JSON number as the tables show it (`-` for null, `inf` for none).
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Some(x) => format!("{x:.1}"),
        None => "-".to_string(),
    }
}

/// `vm1: reservation 100, limit 500, weight 1, idle credit 0` from a PUT's or POST's answer.
fn spec_line(v: &Value) -> String {
    let limit = if v["limit"].is_null() { "none".to_string() } else { number(&v["limit"]) };
    format!(
        "{}: reservation {}, limit {limit}, weight {}, idle credit {}",
        v["name"].as_str().unwrap_or("?"),
        number(&v["reservation"]),
        number(&v["weight"]),
        number(&v["idle_credit"])
    )
}

/// The tenants as a table, one line each, in the server's order.
fn tenants_table(tenants: &[TenantJson]) -> String {
    let mut rows = vec![[
        "TENANT",
        "RESERVATION",
        "LIMIT",
        "WEIGHT",
        "IOPS",
        "QUEUED",
        "LATENCY_MS",
        "BELOW_RESV_S",
        "COMPLETED",
        "ERRORS",
    ]
    .map(String::from)];
    for t in tenants {
        rows.push([
            t.name.clone(),
            number(&t.reservation.into()),
            t.limit.map_or("none".to_string(), |l| number(&l.into())),
            number(&t.weight.into()),
            number(&t.iops_last_s.into()),
            t.queued.to_string(),
            format!("{:.2}", t.latency_mean_ms),
            t.below_reservation_s.to_string(),
            t.completed.to_string(),
            t.errors.to_string(),
        ]);
    }
    table(&rows)
}

/// `GET /api/exports`'s answer as a table.
fn exports_table(v: &Value) -> Result<String> {
    let list = v.as_array().context("the endpoint's exports: not a list")?;
    let mut rows = vec![["EXPORT", "TENANT", "SIZE_MIB", "READ_ONLY"].map(String::from)];
    for e in list {
        rows.push([
            e["name"].as_str().unwrap_or("?").to_string(),
            e["tenant"].as_str().unwrap_or("?").to_string(),
            e["size"].as_u64().map_or("?".to_string(), |b| format!("{:.1}", b as f64 / 1048576.0)),
            e["read_only"].as_bool().map_or("?".to_string(), |r| if r { "yes" } else { "no" }.to_string()),
        ]);
    }
    Ok(table(&rows))
}

/// `GET /api/capacity`'s answer in a line.
fn capacity_line(v: &Value) -> String {
    let iops = if v["iops"].is_null() { "none known".to_string() } else { format!("{} IOPS", number(&v["iops"])) };
    let model = if v["device_model_iops"].is_null() {
        String::new()
    } else {
        format!(", the device model's now {} IOPS", number(&v["device_model_iops"]))
    };
    format!(
        "capacity {iops} (from {}), reserved {} IOPS, admission {}{model}",
        v["source"].as_str().unwrap_or("?"),
        number(&v["reserved_iops"]),
        v["admission"].as_str().unwrap_or("?"),
    )
}

/// Rows as left-aligned columns, two spaces apart.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut s = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_path_segment() {
        assert_eq!(segment("vm1"), "vm1");
        assert_eq!(segment("a b/c?"), "a%20b%2Fc%3F");
    }

    /// What needs attention is named: a refused reload, a certificate within 14 days of expiry, a node
    /// link down; a certificate further off and links up are not.
    #[test]
    fn status_names_what_needs_attention() {
        let now = 1_000_000_000.0;
        let text = format!(
            "rein_build_info{{daemon=\"gateway\",version=\"9.9\"}} 1\nrein_process_start_time_seconds {}\n\
             rein_config_last_reload_successful 0\nrein_config_reloads_total{{result=\"applied\"}} 2\n\
             rein_config_reloads_total{{result=\"failed\"}} 1\nrein_config_restart_pending 0\n\
             rein_tls_certificate_expiration_timestamp_seconds{{use=\"nbd\"}} {}\n\
             rein_tls_certificate_expiration_timestamp_seconds{{use=\"admin\"}} {}\n\
             rein_gateway_node_connections_up{{export=\"v\",node=\"s1\"}} 1\n\
             rein_gateway_node_connections_up{{export=\"v\",node=\"s2\"}} 0\n\
             rein_gateway_node_connections{{export=\"v\",node=\"s1\"}} 1\n\
             rein_gateway_node_connections{{export=\"v\",node=\"s2\"}} 1\n",
            now - 7_500.0,
            now + 3.0 * 86_400.0,
            now + 90.0 * 86_400.0
        );
        let (lines, attention) = status_lines(&rein_runtime::prom::samples(&text), now);
        assert_eq!(lines[0], "rein gateway 9.9, up 2h 05m");
        assert!(
            lines.contains(
                &"configuration: the last reload was REFUSED (2 applied, 1 failed); nothing waits for a restart"
                    .to_string()
            ),
            "{lines:?}"
        );
        assert!(lines.contains(&"node links: 1 of 2 up".to_string()), "{lines:?}");
        assert_eq!(
            attention,
            [
                "the last reload was refused (the log says why)",
                "certificate nbd expires in 3d 0h",
                "1 node link(s) down (rein admin nodes)"
            ]
        );
        // A value that is no number is no reason to pass.
        let odd = "rein_tls_certificate_expiration_timestamp_seconds{use=\"nbd\"} NaN\n\
                   rein_gateway_node_connections_up{node=\"s1\"} NaN\nrein_gateway_node_connections{node=\"s1\"} 1\n";
        let (_, attention) = status_lines(&rein_runtime::prom::samples(odd), now);
        assert_eq!(
            attention,
            ["certificate nbd expires in an unknown time (not a number)", "NaN node link(s) down (rein admin nodes)"]
        );
        // A PARDA host whose one peer's reports are refused, after its first period; none before it.
        let parda = "rein_parda_cluster_hosts 1\nrein_parda_peers 1\nrein_parda_records_refused_total 12\n\
                     rein_parda_periods_total 3\n";
        let (lines, attention) = status_lines(&rein_runtime::prom::samples(parda), now);
        assert!(
            lines.contains(
                &"parda: 1 of 2 hosts in the last cluster average; 12 peer report(s) refused since the start".into()
            ),
            "{lines:?}"
        );
        assert_eq!(attention.len(), 1, "{attention:?}");
        assert!(attention[0].starts_with("PARDA: 1 of 2 hosts in the cluster average"), "{attention:?}");
        for fine in [
            parda.replace("cluster_hosts 1", "cluster_hosts 2"),
            parda.replace("periods_total 3", "periods_total 0"),
            // Local aggregation, or a board: no peers listed, no line.
            parda.replace("peers 1", "peers 0"),
        ] {
            assert!(status_lines(&rein_runtime::prom::samples(&fine), now).1.is_empty(), "{fine}");
        }
        // A pShift controller with a configured server away.
        let ctl = "rein_pshift_round 7\nrein_pshift_servers_connected 1\nrein_pshift_servers 2\n";
        let (lines, attention) = status_lines(&rein_runtime::prom::samples(ctl), now);
        assert!(lines.contains(&"pshift: 1 of 2 server(s) connected, round 7".to_string()), "{lines:?}");
        assert_eq!(attention, ["1 pShift server(s) not connected (rein admin buckets)"]);
        let all = ctl.replace("connected 1", "connected 2");
        assert!(status_lines(&rein_runtime::prom::samples(&all), now).1.is_empty());
        assert_eq!(duration(42.0), "42s");
        assert_eq!(duration(307.0), "5m 07s");
    }

    /// `--config`: the daemon told by its tables; a wildcard admin address asked on loopback; the token
    /// file taken; a file without an admin endpoint refused by name.
    #[test]
    fn the_endpoint_comes_from_the_daemons_own_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let serve = write(
            "rein.toml",
            "admin = \"0.0.0.0:9999\"\nadmin_token_file = \"/etc/rein/admin.token\"\n[[exports]]\nname = \"v\"\nbackend = \"memory\"\nsize_mb = 1\n",
        );
        let (addr, token) = endpoint_of_config(&serve).unwrap();
        assert_eq!(addr, "127.0.0.1:9999");
        assert_eq!(token.as_deref(), Some(std::path::Path::new("/etc/rein/admin.token")));
        let ctl = write(
            "ctl.toml",
            "listen = \"127.0.0.1:7800\"\nadmin = \"[::]:7801\"\nperiod_s = 1\nintervals = 5\n[[servers]]\nname = \"s1\"\ncapacity_iops = 1000\n\
             [[buckets]]\nname = \"b1\"\nreservation_iops = 10\n",
        );
        assert_eq!(endpoint_of_config(&ctl).unwrap().0, "[::1]:7801");
        let gw = write(
            "gw.toml",
            "[[nodes]]\nname = \"s1\"\naddress = \"127.0.0.1:1\"\n[[exports]]\nname = \"v\"\nsize_mb = 1\n",
        );
        assert_eq!(daemon_of(&std::fs::read_to_string(&gw).unwrap(), &gw).unwrap(), Daemon::Gateway);
        let e = endpoint_of_config(&gw).unwrap_err().to_string();
        assert!(e.contains("gw.toml names no admin endpoint"), "{e}");
    }

    /// A number that JSON cannot carry is refused by name: serde_json writes it as null, which the endpoint
    /// reads as "no limit" (`set --limit NaN` removed the limit) or "unchanged"; an empty name too.
    #[test]
    fn rates_are_finite_and_names_not_empty() {
        assert_eq!(finite("2.5"), Ok(2.5));
        for bad in ["NaN", "inf", "-inf", "infinity"] {
            assert!(finite(bad).unwrap_err().contains("is not a finite number"), "{bad}");
        }
        assert!(finite("x").is_err());
        assert_eq!(name(""), Err("a name cannot be empty".to_string()));
        assert_eq!(name(" ").as_deref(), Ok(" "));
    }

    /// The tables and lines carry no escape sequence an endpoint put in a name.
    #[test]
    fn an_endpoints_strings_are_printable() {
        let mut v = json!([{ "name": "a\u{1b}]0;x\u{7}", "n": 1 }]);
        printable(&mut v);
        assert_eq!(v[0]["name"], "a\\u{1b}]0;x\\u{7}");
    }

    #[test]
    fn a_table_lines_up_its_columns() {
        let rows = [["A", "BB"].map(String::from), ["ccc", "d"].map(String::from)];
        assert_eq!(table(&rows), "A    BB\nccc  d\n");
    }
}
