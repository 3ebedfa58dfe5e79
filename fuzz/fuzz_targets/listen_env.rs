//! The socket-activation variables (`$LISTEN_FDS`, `$LISTEN_PID`, `$LISTEN_FDNAMES`): bounds kept, each
//! descriptor for this process with its name (`rein_runtime::harness::listen_env`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rein_runtime::harness::listen_env(data));
