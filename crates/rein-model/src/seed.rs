//! Seeded random streams: one per entity, so adding an entity never changes the others' draws.
//!
//! Every random draw in the simulator and in the daemons' models comes from a PCG stream seeded by
//! [`stream_seed`]`(seed, stream)`: the run's seed and the entity's stream number (a tenant's index in its
//! scenario file, a server's `1 << 32 | index`, ...; a scenario cut into its independent groups keeps
//! them, so a group run alone draws what it draws in the whole run). The mix is splitmix64, so neighbouring stream numbers give unrelated
//! streams.

use rand_pcg::Pcg64Mcg;

/// Stream number of server `index` (tenants use their index as is).
pub fn server_stream(index: usize) -> u64 {
    1 << 32 | index as u64
}

/// Stream number of PARDA host `index` (its period's phase).
pub fn host_stream(index: usize) -> u64 {
    2 << 32 | index as u64
}

/// The 128-bit PCG seed of stream `stream` under the run's `seed`.
pub fn stream_seed(seed: u64, stream: u64) -> u128 {
    // splitmix64 of (seed, stream): independent, reproducible streams per entity.
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0xD1B5_4A32_D192_ED03);
    let hi = splitmix64(&mut z);
    ((hi as u128) << 64) | splitmix64(&mut z) as u128
}

/// The next output of the splitmix64 generator whose state is `state` (advanced): the mix of
/// [`stream_seed`] and of the workload generator's read-mix stream.
#[inline]
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut x = *state;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The PCG stream `stream` under the run's `seed`.
pub fn stream_rng(seed: u64, stream: u64) -> Pcg64Mcg {
    Pcg64Mcg::new(stream_seed(seed, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: u64 = stream_rng(1, 0).gen();
        assert_eq!(a, stream_rng(1, 0).gen::<u64>());
        assert_ne!(a, stream_rng(1, 1).gen::<u64>());
        assert_ne!(a, stream_rng(2, 0).gen::<u64>());
        assert_ne!(stream_seed(1, server_stream(0)), stream_seed(1, 0));
        assert_ne!(stream_seed(1, host_stream(0)), stream_seed(1, server_stream(0)));
    }
}
