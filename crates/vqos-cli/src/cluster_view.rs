//! `vqos cluster status --tenant T --shards N`: what the tenant's aggregator shard leader knows
//! of it (docs/cluster.md, "The agent on the aggregators"), printed after the etcd view.

use anyhow::Result;
use serde_json::{json, Value};
use vqos_cluster::node::view::LeaderView;
use vqos_sched::units::format_rate;

use crate::out::outln;

/// The view as JSON: `{"shard", "endpoint", "term", "holding", "hosts": [{"host",
/// "target_max_bps", "target_min_bps", "counted_max_bps", "counted_min_bps"}]}` (a max of
/// `null` is unlimited).
pub fn to_json(l: &LeaderView) -> Value {
    let hosts: Vec<Value> = l
        .reply
        .hosts
        .iter()
        .map(|h| {
            json!({
                "host": h.host,
                "target_max_bps": h.target_max_bps,
                "target_min_bps": h.target_min_bps,
                "counted_max_bps": h.counted_max_bps,
                "counted_min_bps": h.counted_min_bps,
            })
        })
        .collect();
    json!({
        "shard": l.shard,
        "endpoint": l.endpoint,
        "term": l.reply.term,
        "holding": l.reply.holding,
        "hosts": hosts,
    })
}

/// The view as a table.
pub fn print(l: &LeaderView) -> Result<()> {
    let hold = if l.reply.holding {
        ", in its hold after taking over"
    } else {
        ""
    };
    outln!(
        "\nleader of shard {} (term {}{hold}) at {}:",
        l.shard,
        l.reply.term,
        l.endpoint
    )?;
    outln!(
        "{:<10} {:>11} {:>11} {:>11} {:>11}",
        "HOST",
        "TARGET-MAX",
        "TARGET-MIN",
        "COUNTED-MAX",
        "COUNTED-MIN"
    )?;
    for h in &l.reply.hosts {
        outln!(
            "{:<10} {:>11} {:>11} {:>11} {:>11}",
            h.host,
            format_rate(h.target_max_bps),
            format_rate(Some(h.target_min_bps)),
            format_rate(h.counted_max_bps),
            format_rate(Some(h.counted_min_bps))
        )?;
    }
    if l.reply.hosts.is_empty() {
        outln!("(no host of it in the leader's latest plan)")?;
    }
    Ok(())
}
