//! vqos-sim: being written.
