//! Fuzz-style tests of the PARDA aggregation record: random bytes never panic the decoders, every
//! single-bit flip (exhaustively) and random 2-4 bit flips are detected, and any valid report round-trips.
use proptest::prelude::*;
use rein_core::parda::{HostReport, MAX_HOSTS};
use rein_core::Nanos;
use rein_proto::parda::{decode, decode_slot, encode, encode_slot, Slot, RECORD_BYTES, SLOT_BYTES};

fn report() -> impl Strategy<Value = HostReport> {
    (0..MAX_HOSTS, any::<u64>(), 1..u64::MAX, any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(host, epoch, seq, ts, lat, ios)| HostReport { host, epoch, seq, timestamp: Nanos(ts), latency_ns: lat, ios },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1100)) {
        let _ = decode(&bytes);
        let _ = decode_slot(&bytes);
        if bytes.len() >= SLOT_BYTES {
            let _ = decode_slot(&bytes[..SLOT_BYTES]);
        }
        if bytes.len() >= RECORD_BYTES {
            // Random 64 bytes almost never pass the checksum; if they do, the result must be a real record.
            if let Ok(r) = decode(&bytes[..RECORD_BYTES]) {
                let again = encode(&r);
                prop_assert_eq!(&again[..], &bytes[..RECORD_BYTES]);
            }
        }
    }

    #[test]
    fn valid_reports_round_trip(r in report()) {
        prop_assert_eq!(decode(&encode(&r)).unwrap(), r);
        prop_assert_eq!(decode_slot(&encode_slot(&r)).unwrap(), Slot::Record(r));
    }

    /// The fuzz target's entry point, on random bytes and on valid records and slots with a byte changed.
    #[test]
    fn the_fuzz_harness_holds(bytes in proptest::collection::vec(any::<u8>(), 0..1100), r in report(), at in any::<prop::sample::Index>(), xor in any::<u8>()) {
        rein_proto::harness::parda(&bytes);
        for mut valid in [encode(&r).to_vec(), encode_slot(&r).to_vec()] {
            rein_proto::harness::parda(&valid);
            let i = at.index(valid.len());
            valid[i] ^= xor;
            rein_proto::harness::parda(&valid);
        }
    }

}

proptest! {
    // Exhaustive over the 4,096 bits of a slot; CRC detection is linear (independent of the data), so a
    // few reports suffice.
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn every_single_bit_flip_is_detected(r in report()) {
        let good = encode_slot(&r);
        for bit in 0..SLOT_BYTES * 8 {
            let mut s = good;
            s[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_slot(&s).is_err(), "flip of bit {} went undetected", bit);
            if bit < RECORD_BYTES * 8 {
                prop_assert!(decode(&s[..RECORD_BYTES]).is_err(), "datagram: flip of bit {} went undetected", bit);
            }
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn multi_bit_flips_are_detected(r in report(), bits in proptest::collection::btree_set(0usize..RECORD_BYTES * 8, 2..=4)) {
        let mut b = encode(&r);
        for bit in &bits {
            b[bit / 8] ^= 1 << (bit % 8);
        }
        prop_assert!(decode(&b).is_err(), "flips {:?} went undetected", bits);
    }
}
