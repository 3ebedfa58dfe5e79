//! SIGTERM and SIGINT as streams, for the commands that stop cleanly on them (`rein cluster`, `rein load`).

use anyhow::Result;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGTERM and SIGINT handlers on `rt`, installed at once: a signal from then on is seen by whoever reads
/// the streams (`rein cluster` installs them before its children start, so a signal during start-up stops
/// them rather than this process with its children left running; `rein load` stops its run on them).
pub(crate) fn signals(rt: &tokio::runtime::Runtime) -> Result<(Signal, Signal)> {
    let _rt = rt.enter();
    Ok((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?))
}
