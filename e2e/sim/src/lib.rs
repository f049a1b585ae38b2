//! The contract between ax-sim and the pods it drives, as a library: the simulator reads a pod's
//! script with [`script::PodScript::from_pod`], and tests (of this crate and of ax) write one with
//! [`worker::SimWorker`], so both sides share one definition of the env variables and the node
//! label and taint.

pub mod script;
pub mod worker;
