//! `rein demo` and `rein probe` around other processes' files: the demo never removes a running
//! server's state, and the probe never creates the image it is to measure.
mod common;

use std::process::Command;

fn rein(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rein")).args(args).output().expect("runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into())
}

/// `rein demo --out DIR` while a `rein serve` runs on `DIR/data`: refused, naming the directory in use,
/// and the server's state file stays (the demo removed it before its own server found the directory
/// locked).
#[test]
fn the_demo_leaves_a_running_servers_state_alone() {
    let tmp = common::tmpdir("demo-locked");
    let dir = tmp.path();
    let s = common::serve(dir, 207, common::MEMORY);
    let (code, _, body) = common::http(s.admin, "PUT", "/api/tenants/m", "", r#"{"reservation": 20}"#);
    assert_eq!(code, 200, "{body}");
    let state = dir.join("data").join("rein-state.json");
    let before = std::fs::read_to_string(&state).expect("the server kept its change");
    let (ok, err) = rein(&["demo", "--out", dir.to_str().unwrap(), "--seconds", "6", "--json"]);
    assert!(!ok);
    assert!(err.contains("is in use by another rein serve") && err.contains("choose another --out"), "{err}");
    assert_eq!(std::fs::read_to_string(&state).ok(), Some(before), "the running server's state stays");
    assert!(dir.join("data").join("rein.lock").exists(), "the running server's lock stays");
    drop(s);
}

/// `rein probe` on an export whose image does not exist is refused and creates nothing (it made a sparse
/// image and measured its holes); bad settings are refused before anything is opened.
#[test]
fn the_probe_measures_only_an_existing_image() {
    let tmp = common::tmpdir("probe-missing");
    let dir = tmp.path();
    let cfg = common::write_file(
        dir,
        "rein.toml",
        &format!("data_dir = \"{}\"\n[[exports]]\nname = \"a\"\nsize_mb = 16\n", dir.join("data").display()),
    );
    let cfg = cfg.to_str().unwrap();
    let (ok, err) = rein(&["probe", "--config", cfg, "--seconds", "1"]);
    assert!(!ok);
    assert!(
        err.contains("export \"a\"") && err.contains("a.img does not exist; rein probe measures an existing image"),
        "{err}"
    );
    assert!(!dir.join("data").exists(), "nothing created");
    let (ok, err) = rein(&["probe", "--config", cfg, "--seconds", "0"]);
    assert!(!ok);
    assert!(err.contains("--seconds 0 is out of range"), "{err}");
    assert!(!dir.join("data").exists(), "nothing created");
}

/// `rein probe` on an image that is mostly holes (the built-in default's after its first start) warns that
/// it measures the file system, as the server's start-up probe does; it printed a `capacity_iops` line of
/// some 200,000 IOPS for a created image without a word. An image that holds data gets no warning.
#[test]
fn the_probe_warns_of_an_image_that_is_mostly_holes() {
    let tmp = common::tmpdir("probe-holes");
    let dir = tmp.path();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let image = data.join("a.img");
    std::fs::File::create(&image).unwrap().set_len(16 << 20).unwrap();
    let cfg = common::write_file(
        dir,
        "rein.toml",
        &format!("data_dir = \"{}\"\n[[exports]]\nname = \"a\"\nsize_mb = 16\n", data.display()),
    );
    let cfg = cfg.to_str().unwrap();
    let (ok, err) = rein(&["probe", "--config", cfg, "--seconds", "0.2"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("export \"a\"") && err.contains("a.img is mostly holes (none of its 16 MiB written)"),
        "{err}"
    );
    std::fs::write(&image, vec![0x5a_u8; 16 << 20]).unwrap();
    let (ok, err) = rein(&["probe", "--config", cfg, "--seconds", "0.2"]);
    assert!(ok, "{err}");
    assert!(!err.contains("mostly holes"), "{err}");
}

/// Out-of-range settings are refused naming the flag, the value given and the valid range, as `rein load
/// --seconds` is (`--size-kb 0` said only `--size-kb 0 is out of range`; `--size-kb 20000` and `--depth 0`
/// spoke of the IO size in bytes and of `depth`, under the export's name, as if the export were at fault).
#[test]
fn out_of_range_probe_settings_name_the_flag_and_its_range() {
    let tmp = common::tmpdir("probe-range");
    let dir = tmp.path();
    let cfg = common::write_file(
        dir,
        "rein.toml",
        &format!(
            "data_dir = \"{}\"\n[[exports]]\nname = \"a\"\nbackend = \"memory\"\nsize_mb = 16\n",
            dir.join("data").display()
        ),
    );
    let cfg = cfg.to_str().unwrap();
    let size_kb = "--size-kb {} is out of range: a probe's IO size is 1 to 16384 KiB (16 MiB)";
    let cases: Vec<(&[&str], String)> = vec![
        (&["--size-kb", "0"], size_kb.replace("{}", "0")),
        (&["--size-kb", "20000"], size_kb.replace("{}", "20000")),
        (&["--size-kb", "4294967"], size_kb.replace("{}", "4294967")),
        (&["--seconds", "0"], "--seconds 0 is out of range: a probe lasts more than 0 and at most 600 s".into()),
        (&["--seconds", "1000"], "--seconds 1000 is out of range: a probe lasts more than 0 and at most 600 s".into()),
        (&["--depth", "0"], "--depth 0 is out of range: a probe keeps 1 to 4096 requests outstanding".into()),
        (&["--depth", "5000"], "--depth 5000 is out of range: a probe keeps 1 to 4096 requests outstanding".into()),
        (
            &["--read-pct", "150", "--destructive"],
            "--read-pct 150 is out of range: the share of reads is 0 to 100 (percent)".into(),
        ),
        (
            &["--size-kb", "16384", "--depth", "128"],
            "--depth 128 x --size-kb 16384 is 2048 MiB in flight, above the probe's bound of 1024 MiB (1 GiB): \
             lower either"
                .into(),
        ),
        // The largest IO is in range.
        (&["--size-kb", "16384", "--depth", "1"], String::new()),
    ];
    for (flags, want) in cases {
        let mut args = vec!["probe", "--config", cfg];
        args.extend_from_slice(flags);
        if !flags.contains(&"--seconds") {
            args.extend(["--seconds", "0.2"]);
        }
        let (ok, err) = rein(&args);
        if want.is_empty() {
            assert!(ok, "{flags:?}: {err}");
            continue;
        }
        assert!(!ok, "{flags:?}");
        assert_eq!(err.trim_end(), format!("error: {want}"), "{flags:?}");
    }
}

/// `rein demo` with `--seconds` out of range, or `--scheduler token` (live or `--simulated`), is refused
/// naming the value given, before its output directory is made: `rein demo --seconds 2` made `out/rein-demo/` in the working
/// directory, then said only `--seconds must be between 6 and 3600`.
#[test]
fn the_demo_refuses_its_flags_before_making_its_output_directory() {
    let tmp = common::tmpdir("demo-flags");
    let out = tmp.path().join("out");
    let out_arg = out.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--seconds", "2"], "error: --seconds 2 is out of range: the live demo runs 6 to 3600 s"),
        (&["--seconds", "NaN"], "error: --seconds NaN is out of range: the live demo runs 6 to 3600 s"),
        (&["--seconds", "4000", "--json"], "error: --seconds 4000 is out of range: the live demo runs 6 to 3600 s"),
        (&["--scheduler", "token"], "error: scheduler \"token\" is pShift's"),
        (
            &["--scheduler", "token", "--simulated"],
            "error: scenario \"demo\": server array: scheduler \"token\" is pShift's",
        ),
    ];
    for (flags, want) in cases {
        let mut args = vec!["demo", "--out", out_arg];
        args.extend_from_slice(flags);
        let (ok, err) = rein(&args);
        assert!(!ok, "{flags:?}");
        assert!(err.starts_with(want) && err.lines().count() == 1, "{flags:?}: {err}");
        assert!(!out.exists(), "{flags:?}: --out was made");
    }
}

/// `rein probe` on an image smaller than its IO size (a file export without `size_mb`: the file's own
/// size) is refused naming the export and the flag, before the holes warning and the `probing ...` line
/// (it warned that the 100-byte image was "mostly holes (none of its 0 MiB written)", announced the probe,
/// then failed with `probe: IO size 4096 is larger than the export (100 bytes)`, naming neither).
#[test]
fn the_probe_refuses_an_image_smaller_than_its_io_size_naming_the_export() {
    let tmp = common::tmpdir("probe-tiny");
    let dir = tmp.path();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let image = data.join("a.img");
    let cfg = common::write_file(
        dir,
        "rein.toml",
        &format!("data_dir = \"{}\"\n[[exports]]\nname = \"a\"\n", data.display()),
    );
    let cfg = cfg.to_str().unwrap();
    for (len, flags) in [(100_u64, &[][..]), (0, &[]), (1 << 20, &["--size-kb", "2048"])] {
        std::fs::File::create(&image).unwrap().set_len(len).unwrap();
        let mut args = vec!["probe", "--config", cfg, "--seconds", "0.2"];
        args.extend_from_slice(flags);
        let (ok, err) = rein(&args);
        assert!(!ok, "{len}: {err}");
        let io = if flags.is_empty() { 4096 } else { 2048 * 1024 };
        assert_eq!(
            err.trim_end(),
            format!(
                "error: export \"a\": {} is {len} bytes, less than one IO of --size-kb {} ({io} bytes)",
                image.display(),
                io / 1024
            ),
            "{len}"
        );
    }
}
