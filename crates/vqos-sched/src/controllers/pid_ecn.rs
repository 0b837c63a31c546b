//! PID-controlled ECN marking (seed 003): being written in this session.
