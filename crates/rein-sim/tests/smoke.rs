use rein_sim::{check::check, run, Scenario};
use std::path::Path;

#[test]
fn fig5_smoke() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/mclock-fig5.toml");
    let sc = Scenario::load(&p).unwrap();
    let t0 = std::time::Instant::now();
    let r = run(&sc, &mut |_| {}).unwrap();
    eprintln!("{} events, {} completions in {:?}", r.events, r.completions(), t0.elapsed());
    eprintln!("{}", serde_json::to_string_pretty(&r.summary).unwrap());
    for c in check(&sc, &r) {
        eprintln!("{} {}", if c.ok { "ok  " } else { "MISS" }, c.description);
    }
}
