use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prost::Message;

use super::client::HostSession;
use super::proto;
use super::server::{AggregatorService, Clock, SHARD_HEADER};
use super::{HostCodec, LeaderCodec, RpcError, MAX_NAMES};
use crate::aggregator::{Enforcing, HostGrant, Leader, Report};
use crate::grants::Grant;
use crate::holder::Holder;
use crate::model::{HostStatus, VifStatus};
use crate::shares::{Declarations, Declared};
use crate::split::{Share, TenantLimits};

mod tls;

fn vif(demand: Option<u64>, idle: bool, floor_greedy: bool) -> VifStatus {
    VifStatus {
        rate_bps: demand.unwrap_or(7),
        demand_bps: demand,
        idle,
        floor_greedy,
        ..VifStatus::default()
    }
}

/// A report of `host` with vifs `vm<k>` and what it enforces per tenant.
fn report(host: &str, vifs: &[(&str, VifStatus)], enforcing: &[(&str, u64)]) -> Report {
    Report {
        host: host.into(),
        status: HostStatus {
            health: "ok".into(),
            period_ms: 500,
            vifs: vifs
                .iter()
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect(),
            ..HostStatus::default()
        },
        enforcing: enforcing
            .iter()
            .map(|&(t, epoch)| {
                let e = Enforcing {
                    epoch,
                    max_bps: Some(epoch * 1000),
                    min_bps: epoch,
                };
                (t.to_string(), e)
            })
            .collect(),
    }
}

fn grant(epoch: u64, shares: &[(&str, u64)]) -> HostGrant {
    HostGrant {
        grant: Grant {
            epoch,
            max_bps: Some(900),
            min_bps: 90,
            fallback_max_bps: Some(300),
            fallback_min_bps: 30,
            lease_ms: 2000,
            unknown: BTreeMap::new(),
        },
        shares: shares
            .iter()
            .map(|&(v, m)| {
                let s = Share {
                    min_bps: m / 10,
                    max_bps: Some(m),
                };
                (v.to_string(), s)
            })
            .collect(),
    }
}

/// Through the encoding and back, as the other side reads it.
fn across(host: &mut HostCodec, leader: &mut LeaderCodec, r: &Report, sent: u64) -> Report {
    let wire = proto::Report::decode(host.encode(r, sent).encode_to_vec().as_slice()).unwrap();
    let (echo, got) = leader.decode(wire).unwrap();
    assert_eq!(echo, sent);
    got
}

#[test]
fn a_report_and_its_answer_cross_the_wire_as_they_were() {
    let (mut host, mut leader) = (HostCodec::default(), LeaderCodec::default());
    let vifs = [
        ("vm1", vif(Some(300), false, false)),
        ("vm2", vif(None, true, false)),
        ("vm3", vif(Some(5), false, true)),
    ];
    let r = report("h1", &vifs, &[("acme", 4), ("beta", 0)]);
    assert_eq!(across(&mut host, &mut leader, &r, 11), r);
    // The next period names nothing again: no host, no new names, same reading.
    let r2 = report("h1", &vifs[..2], &[("acme", 5)]);
    let wire = host.encode(&r2, 12);
    assert!(wire.host.is_empty() && wire.new_vifs.is_empty() && wire.new_tenants.is_empty());
    assert_eq!(leader.decode(wire).unwrap(), (12, r2));
    assert_eq!(leader.host(), Some("h1"));
    // The answer comes back by name; what the host did not name is left out.
    let mut answers = BTreeMap::new();
    answers.insert("acme".to_string(), grant(9, &[("vm1", 500), ("vm9", 1)]));
    answers.insert("gamma".to_string(), grant(3, &[("vm2", 5)]));
    let wire = proto::Answer::decode(leader.encode(&answers, 12).encode_to_vec().as_slice());
    let (sent, got) = host.decode(wire.unwrap()).unwrap();
    assert_eq!(sent, 12);
    assert_eq!(got.keys().collect::<Vec<_>>(), ["acme"]);
    assert_eq!(got["acme"], grant(9, &[("vm1", 500)]));
}

#[test]
fn a_hundred_vifs_in_twenty_tenants_take_a_fifth_of_their_json() {
    let (mut host, mut leader) = (HostCodec::default(), LeaderCodec::default());
    let names: Vec<String> = (0..100).map(|k| format!("vm-{k:03}")).collect();
    let tenants: Vec<String> = (0..20).map(|k| format!("tenant-{k:02}")).collect();
    let vifs: Vec<(&str, VifStatus)> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            (
                n.as_str(),
                vif(Some(97_000_000 + k as u64 * 1_013), false, false),
            )
        })
        .collect();
    let held: Vec<(&str, u64)> = tenants
        .iter()
        .map(|t| (t.as_str(), 1u64 << 32 | 17))
        .collect();
    let r = report("host-0042", &vifs, &held);
    let first = host.encode(&r, 1).encoded_len();
    across(&mut HostCodec::default(), &mut leader, &r, 1);
    let steady = host.encode(&r, 2).encoded_len();
    let json = serde_json::to_vec(&r).unwrap().len();
    // The design's estimate (docs/cluster.md): about 2.2 KiB a period for such a host.
    assert!(steady <= 2_250, "{steady} bytes a period");
    assert!(steady * 5 <= json, "{steady} against {json} bytes of JSON");
    assert!(
        first > steady + 100 * 6,
        "the names travel once: {first} then {steady}"
    );
    // Answers: a grant per tenant and a share per vif.
    let answers: BTreeMap<String, HostGrant> = tenants
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let shares: Vec<(&str, u64)> = (0..5)
                .map(|j| (names[k * 5 + j].as_str(), 123_456_789))
                .collect();
            (t.clone(), grant(1 << 32 | 18, &shares))
        })
        .collect();
    let down = leader.encode(&answers, 2).encoded_len();
    let down_json = serde_json::to_vec(&answers).unwrap().len();
    assert!(
        down <= 2_250 && down * 4 <= down_json,
        "{down} against {down_json}"
    );
}

#[test]
fn hostile_reports_are_refused_whole_and_leave_the_session_as_it_was() {
    let mut leader = LeaderCodec::default();
    let nameless = proto::Report::default();
    let e = leader.decode(nameless).unwrap_err();
    assert_eq!(e.to_string(), "the first report names no host");
    let good = proto::Report {
        host: "h1".into(),
        new_vifs: vec!["vm1".into()],
        ..Default::default()
    };
    leader.decode(good).unwrap();
    // An index past the table, with a new name in the same report: refused, the name not kept.
    let bad = proto::Report {
        new_vifs: vec!["vm2".into()],
        vifs: vec![proto::VifReport {
            vif: 7,
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = leader.decode(bad).unwrap_err();
    assert_eq!(e.to_string(), "vif index 7, but this session named 2 vifs");
    let uses_vm2 = proto::Report {
        vifs: vec![proto::VifReport {
            vif: 1,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(matches!(
        leader.decode(uses_vm2),
        Err(RpcError::UnknownIndex { known: 1, .. })
    ));
    let tenant = proto::Report {
        enforcing: vec![proto::Enforcing {
            tenant: 0,
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = leader.decode(tenant).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tenant index 0, but this session named 0 tenants"
    );
    let other = proto::Report {
        host: "h2".into(),
        ..Default::default()
    };
    let e = leader.decode(other).unwrap_err();
    assert_eq!(
        e.to_string(),
        "this session is host 'h1's; a report says 'h2'"
    );
    let long = proto::Report {
        new_tenants: vec!["x".repeat(256)],
        ..Default::default()
    };
    let e = leader.decode(long).unwrap_err();
    assert_eq!(e.to_string(), "a tenant name of 256 bytes: 1 to 255");
    let many = proto::Report {
        new_vifs: (0..MAX_NAMES).map(|k| format!("v{k}")).collect(),
        ..Default::default()
    };
    let e = leader.decode(many).unwrap_err();
    assert_eq!(
        e.to_string(),
        "65537 vif names in one session: at most 65536"
    );
    // Still the same session: vm1 is index 0, and a well-formed report goes through.
    let fine = proto::Report {
        vifs: vec![proto::VifReport {
            vif: 0,
            rate_bps: 3,
            ..Default::default()
        }],
        ..Default::default()
    };
    let (_, r) = leader.decode(fine).unwrap();
    assert_eq!((r.host.as_str(), r.status.vifs["vm1"].rate_bps), ("h1", 3));
}

/// A clock the test steps.
#[derive(Default)]
struct Stepped(AtomicU64);

impl Clock for Stepped {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const PERIOD_NS: u64 = 500_000_000;
const MAX: u64 = 1_000_000_000;

/// `hosts` hosts with 5 vifs each in tenant acme (max 1 Gbit/s), every vif greedy.
fn acme(hosts: usize) -> (Declarations, BTreeMap<String, TenantLimits>, Vec<Holder>) {
    let mut declared = Declarations::new();
    let mut holders = Vec::new();
    for h in 0..hosts {
        let mut own = BTreeMap::new();
        for v in 0..5 {
            let d = Declared {
                tenant: "acme".into(),
                weight: 1,
                max_bps: None,
            };
            declared
                .entry(format!("h{h}"))
                .or_default()
                .insert(format!("vm{v}"), d);
            let uncapped = Share {
                min_bps: 0,
                max_bps: None,
            };
            own.insert(format!("vm{v}"), uncapped);
        }
        let mut holder = Holder::default();
        let fallback = (Some(MAX / hosts as u64), 0);
        holder.start("acme", fallback, &own);
        holders.push(holder);
    }
    let limits = TenantLimits {
        max_bps: Some(MAX),
        min_bps: 0,
    };
    (
        declared,
        BTreeMap::from([("acme".to_string(), limits)]),
        holders,
    )
}

fn held_max(holders: &[Holder]) -> u64 {
    holders
        .iter()
        .flat_map(|h| {
            h.get("acme")
                .map(|x| x.shares.values().map(|s| s.max_bps.unwrap_or(u64::MAX)))
        })
        .flatten()
        .fold(0u64, u64::saturating_add)
}

/// `service` served on a port of loopback: the server's task and a channel to it.
async fn serve(
    service: &AggregatorService,
) -> (
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    tonic::transport::Channel,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .add_service(service.clone().into_server())
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (server, channel)
}

/// Sends `r` at `now` and applies every answer up to its own: the ones the leader pushed
/// since, leased from the report each names, first.
async fn exchange(session: &mut HostSession, holder: &mut Holder, r: &Report, now: u64) {
    session.send(r, now).await.unwrap();
    loop {
        let (sent, grants) = session.answer().await.unwrap();
        assert!(sent <= now, "an answer leased from a report not sent yet");
        holder.apply(&grants, sent, now);
        if sent == now {
            return;
        }
    }
}

/// Host `h`'s report of acme: its five vifs wanting `demand` each (`None`: greedy).
fn acme_report(h: usize, demand: Option<u64>, holder: &Holder) -> Report {
    Report {
        host: format!("h{h}"),
        status: HostStatus {
            vifs: (0..5)
                .map(|v| (format!("vm{v}"), vif(demand, false, false)))
                .collect(),
            ..HostStatus::default()
        },
        enforcing: holder.enforcing(),
    }
}

fn acme_max(holder: &Holder) -> u64 {
    holder.enforcing()["acme"].max_bps.unwrap_or(u64::MAX)
}

/// docs/cluster.md, "Pushed raises", over the real transport: a plan's decrease reaches its
/// host between its reports, and the release it confirms reaches the host waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrease_and_the_raise_it_releases_are_pushed_over_grpc() {
    let clock = Arc::new(Stepped::default());
    let service = AggregatorService::new(clock.clone());
    service.lead(
        0,
        Leader::new(1, 0, 4 * PERIOD_NS, PERIOD_NS / 10),
        u64::MAX,
    );
    let (server, channel) = serve(&service).await;
    let (declared, tenants, mut holders) = acme(2);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        sessions.push(HostSession::open(channel.clone(), 0).await.unwrap());
    }
    // h0 wants 110 Mbit/s (22 a vif), h1 all it can get: past the hold, 110 and 890.
    let mut demand = [Some(22_000_000), None];
    let mut now = 0;
    for period in 0..8u64 {
        now = period * PERIOD_NS;
        clock.0.store(now, Ordering::SeqCst);
        service.with_leader(0, |l| l.plan(&declared, &tenants));
        for h in 0..2 {
            holders[h].lapse(now);
            let r = acme_report(h, demand[h], &holders[h]);
            exchange(&mut sessions[h], &mut holders[h], &r, now).await;
        }
    }
    assert_eq!(
        (acme_max(&holders[0]), acme_max(&holders[1])),
        (110_000_000, 890_000_000)
    );
    let h1_sent = now;
    // h0 turns greedy; the next plan splits 500 each and pushes h1 its decrease.
    demand[0] = None;
    now += PERIOD_NS;
    clock.0.store(now, Ordering::SeqCst);
    let r = acme_report(0, demand[0], &holders[0]);
    exchange(&mut sessions[0], &mut holders[0], &r, now).await;
    service.with_leader(0, |l| l.plan(&declared, &tenants));
    service.push(0);
    let wait = std::time::Duration::from_secs(10);
    let (sent, grants) = tokio::time::timeout(wait, sessions[1].answer())
        .await
        .expect("the decrease is pushed")
        .unwrap();
    assert_eq!(sent, h1_sent, "leased from h1's latest report");
    holders[1].apply(&grants, sent, now);
    assert_eq!(acme_max(&holders[1]), 500_000_000);
    // h0 asks again: h1 has not confirmed, so h0 stays at 110, short of its 500.
    now += 1_000_000;
    clock.0.store(now, Ordering::SeqCst);
    let r = acme_report(0, demand[0], &holders[0]);
    exchange(&mut sessions[0], &mut holders[0], &r, now).await;
    assert_eq!(acme_max(&holders[0]), 110_000_000);
    assert!(sessions[0].try_answer().is_none(), "nothing released yet");
    // h1 reports holding 500: the release is confirmed and h0's raise pushed at once.
    let h0_sent = now;
    now += 1_000_000;
    clock.0.store(now, Ordering::SeqCst);
    let r = acme_report(1, demand[1], &holders[1]);
    exchange(&mut sessions[1], &mut holders[1], &r, now).await;
    let (sent, grants) = tokio::time::timeout(wait, sessions[0].answer())
        .await
        .expect("the raise is pushed")
        .unwrap();
    assert_eq!(sent, h0_sent);
    holders[0].apply(&grants, sent, now);
    assert_eq!(acme_max(&holders[0]), 500_000_000);
    assert!(acme_max(&holders[0]) + acme_max(&holders[1]) <= MAX);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_over_grpc_reach_the_split_and_never_hold_above_the_max() {
    let clock = Arc::new(Stepped::default());
    let leader = Leader::new(1, 0, 4 * PERIOD_NS, PERIOD_NS / 10);
    let service = AggregatorService::new(clock.clone());
    service.lead(0, leader, u64::MAX);
    let (server, channel) = serve(&service).await;
    let hosts = 20;
    let (declared, tenants, mut holders) = acme(hosts);
    let mut sessions = Vec::new();
    for _ in 0..hosts {
        sessions.push(HostSession::open(channel.clone(), 0).await.unwrap());
    }
    // A hostile session beside them: refused with the reason, the others unharmed.
    let mut raw = proto::aggregator_client::AggregatorClient::new(channel.clone());
    let bad = proto::Report {
        host: "h0".into(),
        vifs: vec![proto::VifReport {
            vif: 99,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut request = tonic::Request::new(tokio_stream::iter([bad]));
    request
        .metadata_mut()
        .insert(SHARD_HEADER, tonic::metadata::MetadataValue::from(0u32));
    let mut answers = raw.session(request).await.unwrap().into_inner();
    let status = answers.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "vif index 99, but this session named 0 vifs"
    );
    for period in 0..16u64 {
        let now = period * PERIOD_NS;
        clock.0.store(now, Ordering::SeqCst);
        service.with_leader(0, |l| l.plan(&declared, &tenants));
        for (h, session) in sessions.iter_mut().enumerate() {
            let holder = &mut holders[h];
            holder.lapse(now);
            let vifs = (0..5)
                .map(|v| (format!("vm{v}"), vif(None, false, false)))
                .collect();
            let r = Report {
                host: format!("h{h}"),
                status: HostStatus {
                    vifs,
                    ..HostStatus::default()
                },
                enforcing: holder.enforcing(),
            };
            exchange(session, holder, &r, now).await;
            let held = held_max(&holders);
            assert!(
                held <= MAX,
                "period {period}, host {h}: {held} held under {MAX}"
            );
        }
    }
    // Past the new leader's hold, every greedy vif holds its equal part of the max.
    for holder in &holders {
        let shares = &holder.get("acme").unwrap().shares;
        assert!(
            shares.values().all(|s| s.max_bps == Some(MAX / 100)),
            "{shares:?}"
        );
    }
    assert_eq!(held_max(&holders), MAX);
    server.abort();
}

/// A session names its shard; a node answers only for the shards it leads, and only until its
/// `valid_until`; past it, or for another shard, the host is told to look the leader up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_answers_only_for_the_shards_it_leads_and_only_while_it_may() {
    let clock = Arc::new(Stepped::default());
    let service = AggregatorService::new(clock.clone());
    service.lead(2, Leader::new(1, 0, 4 * PERIOD_NS, 0), PERIOD_NS);
    let (server, channel) = serve(&service).await;
    let r = report("h0", &[("vm0", vif(None, false, false))], &[]);
    // Without the header: refused, with what is missing.
    let mut raw = proto::aggregator_client::AggregatorClient::new(channel.clone());
    let status = raw
        .session(tokio_stream::iter([proto::Report::default()]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("vqos-shard"), "{status:?}");
    // Another shard: not led here.
    let mut other = HostSession::open(channel.clone(), 3).await.unwrap();
    other.send(&r, 0).await.unwrap();
    let e = other.answer().await.unwrap_err();
    assert_eq!(
        e,
        RpcError::NotLeader("this node does not lead shard 3".into())
    );
    // Its own shard: answered while valid, refused once past valid_until.
    let mut own = HostSession::open(channel.clone(), 2).await.unwrap();
    own.send(&r, 0).await.unwrap();
    assert_eq!(own.answer().await.unwrap().0, 0);
    clock.0.store(PERIOD_NS, Ordering::SeqCst);
    own.send(&r, PERIOD_NS).await.unwrap();
    let e = own.answer().await.unwrap_err();
    assert!(matches!(e, RpcError::NotLeader(_)), "{e}");
    // Renewed, a new session is answered again; resigned, it is not.
    assert!(service.renew(2, 3 * PERIOD_NS));
    let mut again = HostSession::open(channel.clone(), 2).await.unwrap();
    again.send(&r, PERIOD_NS).await.unwrap();
    assert_eq!(again.answer().await.unwrap().0, PERIOD_NS);
    assert!(service.resign(2).is_some());
    assert!(service.leading().is_empty() && !service.renew(2, u64::MAX));
    again.send(&r, PERIOD_NS).await.unwrap();
    assert!(again.answer().await.is_err());
    server.abort();
}

#[test]
fn a_candidates_failure_is_listed_until_it_is_elected() {
    let service = AggregatorService::new(Arc::new(Stepped::default()));
    assert!(service.candidacy_problems().is_empty());
    service.set_candidacy_problem(1, Some("etcd: permission denied".into()));
    service.set_candidacy_problem(0, Some("etcd: unreachable".into()));
    // A clone (the node's tasks hold clones) sees and mends the same list.
    let other = service.clone();
    assert_eq!(
        other.candidacy_problems(),
        [
            "shard 0: etcd: unreachable",
            "shard 1: etcd: permission denied"
        ]
    );
    other.set_candidacy_problem(0, None);
    assert_eq!(
        service.candidacy_problems(),
        ["shard 1: etcd: permission denied"]
    );
}
