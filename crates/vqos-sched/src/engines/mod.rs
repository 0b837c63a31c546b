//! The engines. Each file is one algorithm behind [`crate::Engine`].

pub mod ancs;
pub mod c2qos;
pub mod policer;
pub mod rr;
pub mod tcm;
pub mod vqos;
