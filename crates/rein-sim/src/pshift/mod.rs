//! pShift in the simulator: the paper's synthetic instances ([`gen`]).

pub mod gen;
