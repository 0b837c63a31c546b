//! Fairness adjuster (seed 001): being written in this session.
