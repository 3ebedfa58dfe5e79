//! Replays the committed fuzz corpus of rein-runtime's targets (`fuzz/corpus/<target>/` and
//! `fuzz/seeds/<target>/` at the repository root) through the same `rein_runtime::harness` functions the
//! fuzz targets call, so CI checks every input the fuzzer kept without a nightly toolchain (rein-proto's
//! `tests/corpus.rs` does the wire decoders').
#[path = "../../../fuzz/replay.rs"]
mod replay;
use replay::{inputs, replay};
use std::path::Path;

#[test]
fn server_config_corpus() {
    replay("server_config", rein_runtime::harness::server_config);
}

#[test]
fn pshift_controller_config_corpus() {
    replay("pshift_controller_config", rein_runtime::harness::pshift_controller_config);
}

#[test]
fn gateway_config_corpus() {
    replay("gateway_config", rein_runtime::harness::gateway_config);
}

#[test]
fn gateway_layouts_corpus() {
    replay("gateway_layouts", rein_runtime::harness::gateway_layouts);
}

#[test]
fn admin_body_corpus() {
    replay("admin_body", rein_runtime::harness::admin_bodies);
}

#[test]
fn admin_response_corpus() {
    replay("admin_response", rein_runtime::harness::admin_response);
}

#[test]
fn state_file_corpus() {
    replay("state_file", rein_runtime::harness::state_file);
}

#[test]
fn state_journal_corpus() {
    replay("state_journal", rein_runtime::harness::state_journal);
}

#[test]
fn admin_token_corpus() {
    replay("admin_token", rein_runtime::harness::admin_token);
}

#[test]
fn psk_file_corpus() {
    replay("psk_file", rein_runtime::harness::psk_file);
}

#[test]
fn admin_create_corpus() {
    replay("admin_create", rein_runtime::harness::admin_create);
}

#[test]
fn access_list_corpus() {
    replay("access_list", rein_runtime::harness::access_list);
}

#[test]
fn listen_env_corpus() {
    replay("listen_env", rein_runtime::harness::listen_env);
}

#[test]
fn job_spec_corpus() {
    replay("job_spec", rein_runtime::harness::job_spec);
}

/// The seeds are what they claim: the documented and built-in configurations parse, the bodies decode.
#[test]
fn seeds_are_valid() {
    use rein_runtime::config::ServerConfig;
    for (path, bytes) in inputs("server_config").iter().filter(|(p, _)| p.to_string_lossy().contains("/seeds/")) {
        let text = std::str::from_utf8(bytes).expect("UTF-8");
        if let Err(e) = ServerConfig::parse(text, path) {
            panic!("seed {}: {e}", path.display());
        }
    }
    let seeds = |target| inputs(target).into_iter().filter(|(p, _)| p.to_string_lossy().contains("/seeds/"));
    for (path, bytes) in seeds("state_file") {
        let st = rein_runtime::state::parse(&bytes).unwrap_or_else(|e| panic!("seed {}: {e}", path.display()));
        assert!(!st.is_empty(), "seed {}: an empty state", path.display());
    }
    for (path, bytes) in seeds("state_journal") {
        let mut st = None;
        rein_runtime::state::apply_journal(&mut st, &bytes).unwrap_or_else(|e| panic!("seed {}: {e}", path.display()));
        assert!(st.is_some_and(|s| !s.is_empty()), "seed {}: an empty state", path.display());
    }
    for (path, bytes) in seeds("gateway_layouts") {
        let f =
            rein_runtime::gateway::layouts::parse(&bytes).unwrap_or_else(|e| panic!("seed {}: {e}", path.display()));
        assert!(!f.volumes.is_empty(), "seed {}: no volume", path.display());
    }
    for (path, bytes) in seeds("psk_file") {
        let text = std::str::from_utf8(&bytes).expect("UTF-8");
        rein_runtime::tls::parse_psk_file(text, &path).unwrap_or_else(|e| panic!("seed {}: {e}", path.display()));
    }
    for (path, bytes) in seeds("admin_token") {
        rein_runtime::admin_guard::AdminToken::parse(&bytes).unwrap_or_else(|e| panic!("seed {}: {e}", path.display()));
    }
    for (path, bytes) in seeds("admin_create") {
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        assert!(body.get("name").is_some(), "seed {}: no name", path.display());
    }
}

/// Found by `server_config` (artifact crash-29aa5f3e9f5a17c7ff78c8f4da37baec701e065e, after 829,195 runs):
/// an export named `""` without a `tenant` was accepted, and made a default tenant with an empty name
/// (which `[[tenants]]` refuses), reachable by nobody's `PUT /api/tenants/{name}`. Now refused, naming why.
#[test]
fn crash_29aa5f3e_an_export_with_an_empty_name() {
    let input = b"\n[[exports]]\nname = \"\"\n\t\t\t#eigm\t\t\t\t\t\tpreset = \t\t\t\t\t\t\t\t\t\tht = 3\n";
    rein_runtime::harness::server_config(input);
    let e = rein_runtime::config::ServerConfig::parse("[[exports]]\nname = \"\"", Path::new("x.toml")).unwrap_err();
    assert_eq!(e.to_string(), "config: an [[exports]] entry has an empty name");
}

/// Found by `state_file` (artifact crash-e9524b1cc0bf66af17b100199c63bbc81888b2e3, after 64,557 runs): a
/// state file deleting an export (`DELETE /api/exports/a`, then a restart) left the configuration's
/// `default_export` index where it was, so it named the export after the deleted one, or pointed past the
/// list and the start panicked (`cfg.exports[i]` in `server::run`). `state::overlay` now finds the default
/// export again by name, and when it is the deleted one the empty name opens nothing (with a log note).
#[test]
fn crash_e9524b1c_a_deleted_export_moves_the_default_export() {
    use rein_runtime::state::{overlay, parse};
    let input = b"{\n  \"version\": 1,\n  \"exports\": {\n    \"a\": {\n    \"config\": {\"name\": \"a\", \
\"backend\": \"memory\", \"size_mb\": 1, \"tenant\": \"a\", \"read_only\": false, \"direct\": false}\n    }\n  }\n}\n";
    rein_runtime::harness::state_file(input);
    let base = rein_runtime::config::ServerConfig::parse(
        "data_dir = \"/d\"\ndefault_export = \"b\"\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n\
         [[exports]]\nname = \"b\"\nbackend = \"memory\"\nsize_mb = 1\n[[exports]]\nname = \"c\"\nbackend = \"memory\"\n\
         size_mb = 1\n",
        Path::new("x.toml"),
    )
    .unwrap();
    let o = overlay(&base, &parse(input).unwrap());
    let names: Vec<_> = o.config.exports.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["b", "c"]);
    assert_eq!(o.config.default_export, Some(0), "the default export is still b");
    let gone = std::str::from_utf8(input).unwrap().replace("\"a\"", "\"b\"");
    let o = overlay(&base, &parse(gone.as_bytes()).unwrap());
    assert_eq!(o.config.default_export, None, "b is deleted: the empty name opens nothing");
    assert!(o.notes.iter().any(|n| n.contains("default_export b: the export is deleted")), "{:?}", o.notes);
}

/// Found by `state_file` (artifact crash-0f3aab595a510932321d01e5312169dda0d68329, after 5,522 runs): a
/// number the server wrote into the state file read back as another number. serde_json's default float
/// parser is "best effort" and misreads some of its own shortest-form output by one ulp: the configuration's
/// `probe_capacity_s = 1.6666666666666665`, recorded with a measured capacity, came back as
/// 1.6666666666666663, so the next start took the file for changed and dropped the capacity (the same for a
/// tenant spec's numbers). The workspace now builds serde_json with `float_roundtrip`.
#[test]
fn crash_0f3aab59_a_state_file_number_reads_back_as_another() {
    let input = br#"{"version":1,"tenants":{},"exports":{},"capacity":{"iops":1233.5,"source":"probe","config":{"capacity_iops":null,"probe_capacity_s":1.666666666666666666666666660}}}"#;
    let written: f64 = "1.6666666666666665".parse().unwrap();
    let read: f64 = serde_json::from_str(&serde_json::to_string(&written).unwrap()).unwrap();
    assert_eq!(read.to_bits(), written.to_bits(), "{written} written, {read} read back");
    rein_runtime::harness::state_file(input);
}

/// Found by `state_file` (artifact crash-57c11a025c170e4e8156e786a156b4f8660a22e2, after 3,691,629 runs):
/// a state file's new tenant with a name of 487 bytes was applied, although `POST /api/tenants` (the only
/// way such a tenant is made) refuses names over `MAX_TENANT_NAME` (256) bytes; an empty name went through
/// the same way. `state::overlay` now drops such an entry with a note. Found by reading the same code: an
/// export entry whose export has another name than its key was applied too, next to the configuration's
/// export of that name (two exports of one name); now dropped with a note.
#[test]
fn crash_57c11a02_a_state_file_tenant_name_over_the_bound() {
    use rein_runtime::live::MAX_TENANT_NAME;
    use rein_runtime::state::{overlay, parse};
    let spec = r#"{"spec": {"reservation": 5.0, "limit": null, "weight": 1.0, "idle_credit": 0}, "config": null}"#;
    let base = rein_runtime::config::ServerConfig::parse(
        "data_dir = \"/d\"\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n",
        Path::new("x.toml"),
    )
    .unwrap();
    for (len, kept) in [(0, false), (1, true), (MAX_TENANT_NAME, true), (MAX_TENANT_NAME + 1, false)] {
        let name = "n".repeat(len);
        let input = format!(r#"{{"version": 1, "tenants": {{"{name}": {spec}}}}}"#);
        rein_runtime::harness::state_file(input.as_bytes());
        let o = overlay(&base, &parse(input.as_bytes()).unwrap());
        assert_eq!(o.config.tenants.iter().any(|t| t.name == name), kept, "a new tenant's name of {len} bytes");
        assert_eq!(o.pruned, !kept);
    }
    let export = r#"{"name": "a", "backend": "memory", "size_mb": 1, "tenant": "a"}"#;
    let input = format!(r#"{{"version": 1, "exports": {{"x": {{"export": {export}, "config": null}}}}}}"#);
    rein_runtime::harness::state_file(input.as_bytes());
    let o = overlay(&base, &parse(input.as_bytes()).unwrap());
    assert_eq!(o.config.exports.len(), 1);
    assert!(
        o.notes.iter().any(|n| n.contains("dropped the state file's export x: it is named \"a\"")),
        "{:?}",
        o.notes
    );
}

/// Found by `state_file` (artifact crash-1fad09e846c529d959c38077e3e4bbc63ca1bc50, after 3,130,510 runs,
/// 2026-11-28): a state file's capacity of 0 IOPS was applied at start (admission would then refuse every
/// reservation), although `PUT /api/capacity` and the probe only ever write a positive one and
/// `capacity_iops` in rein.toml must be positive. `state::overlay` now drops such a capacity with a note,
/// as it drops the other entries no run-time change could have written.
#[test]
fn crash_1fad09e8_a_state_file_capacity_of_zero() {
    use rein_runtime::state::{overlay, parse};
    let base = rein_runtime::config::ServerConfig::parse(
        "data_dir = \"/d\"\ncapacity_iops = 1000\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 1\n",
        Path::new("x.toml"),
    )
    .unwrap();
    for (iops, kept) in [("0", false), ("-5.0", false), ("0.0", false), ("1e-9", true), ("5000", true)] {
        let input = format!(
            r#"{{"version": 1, "capacity": {{"iops": {iops}, "source": "admin", "config": {{"capacity_iops": 1000.0, "probe_capacity_s": 0.0}}}}}}"#
        );
        rein_runtime::harness::state_file(input.as_bytes());
        let o = overlay(&base, &parse(input.as_bytes()).unwrap());
        assert_eq!(o.capacity.is_some(), kept, "a capacity of {iops} IOPS");
        assert_eq!(o.pruned, !kept, "{iops}");
        if !kept {
            assert!(o.notes.iter().any(|n| n.contains("capacity must be positive")), "{:?}", o.notes);
        }
    }
}

/// Found by `psk_file` (artifact crash-a9f226cb2c35506e67a142d7b233e933b7679678, in a 40 s run): a key
/// with a `+` among its digits was accepted (`u8::from_str_radix("+0", 16)` is 0), so `client1:+000..`
/// gave a key that is not what the line says instead of the error "the key is not hexadecimal". The hex
/// decoder now takes digits only.
#[test]
fn crash_a9f226cb_a_plus_sign_in_a_psk_key() {
    let mut input = b"client1:".to_vec();
    input.extend(std::iter::repeat_n(b'0', 1024));
    input[8 + 6] = b'+';
    input.push(b'\n');
    rein_runtime::harness::psk_file(&input);
    for line in ["a:+f", "a:+f+f", "a:0+1f", "a:-1"] {
        let e = rein_runtime::tls::parse_psk_file(line, Path::new("k.psk")).unwrap_err();
        assert_eq!(e.to_string(), "tls.psk_file k.psk line 1: the key is not hexadecimal", "{line}");
    }
    assert_eq!(rein_runtime::tls::parse_psk_file("a: 0F \n", Path::new("k.psk")).unwrap()["a"], [15]);
}

/// Found by `access_list` (artifact crash-bb4a71c2bb659b1e4f59f229cccc2a23ab447680, after 3,331,392 runs):
/// an `allow_networks` entry written as an IPv4-mapped IPv6 address (`::FFFF:FF:2F`, i.e.
/// `::ffff:0.255.0.47`) or network admitted nobody: clients are compared as IPv4 when their address is
/// mapped, and the entry stayed an IPv6 network. Entries are now kept as the IPv4 network they map.
#[test]
fn crash_bb4a71c2_an_ipv4_mapped_network_admits_nobody() {
    rein_runtime::harness::access_list(b"\nn:::1\nn:::FFFF:FF:2F");
    let list = |n: &str| Some(vec![n.to_string()]);
    let parse = |n: &str| rein_runtime::config::parse_access("x", &list(n), &None).unwrap();
    let client: std::net::IpAddr = "10.1.2.3".parse().unwrap();
    let mapped: std::net::IpAddr = "::ffff:10.1.2.3".parse().unwrap();
    for entry in ["::ffff:10.1.2.3", "::ffff:10.0.0.0/104", "10.0.0.0/8"] {
        let access = parse(entry);
        assert!(access.allows(client, None) && access.allows(mapped, None), "{entry}");
    }
    assert_eq!(parse("::ffff:10.0.0.0/104").networks.unwrap()[0].to_string(), "10.0.0.0/8");
    // Not mapped: unchanged, and IPv6 only.
    assert_eq!(parse("2001:db8::/32").networks.unwrap()[0].to_string(), "2001:db8::/32");
    assert!(!parse("::/0").allows(client, None));
}
