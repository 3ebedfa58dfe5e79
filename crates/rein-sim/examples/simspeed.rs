fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let n = args.first().copied().unwrap_or(1000);
    let sc = rein_sim::bench::scenario(n, 8, 5.0, "mclock");
    let t0 = std::time::Instant::now();
    let r = rein_sim::run(&sc, &mut |_| {}).unwrap();
    let el = t0.elapsed().as_secs_f64();
    println!("{n} tenants x 8 servers: {} completions in {el:.3}s = {:.2} M/s ({} events)", r.completions(), r.completions() as f64 / el / 1e6, r.events);
}
