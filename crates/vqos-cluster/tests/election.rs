//! The aggregator shards' elections on a real etcd (`vqos_cluster::election`): the first
//! candidate leads in term 1, the next waits and leads in term 2 when the first resigns or its
//! lease runs out, shards are independent, and hosts find the leader's endpoint. Each test
//! starts its own etcd on loopback ports of its own; skipped with a message when `etcd` is not
//! installed.

use std::time::Duration;

use vqos_cluster::election::{campaign, leader_of, term_key};
use vqos_cluster::etcd::kv_client;
use vqos_cluster::etcd_client::Client;
use vqos_cluster::EtcdSettings;
use vqos_testkit::Etcd;

const CALL: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(2);

fn skip(test: &str) -> bool {
    match vqos_testkit::etcd_missing() {
        Some(why) => {
            println!("SKIP {test}: {why}");
            true
        }
        None => false,
    }
}

async fn connect(etcd: &Etcd) -> Client {
    let settings = EtcdSettings::from_list(&etcd.url()).unwrap();
    settings.connect(CALL).await.unwrap()
}

/// A client to campaign on: its calls have no deadline of their own.
async fn waiter(etcd: &Etcd) -> Client {
    let settings = EtcdSettings::from_list(&etcd.url()).unwrap();
    settings.connect_waiting(CALL).await.unwrap()
}

async fn term_in_etcd(c: &Client, shard: u32) -> String {
    let got = kv_client(c).get(term_key(shard), None).await.unwrap();
    String::from_utf8(got.kvs()[0].value().to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_candidate_leads_in_the_next_term_once_the_first_resigns() {
    if skip("election resign") {
        return;
    }
    let etcd = Etcd::start(0);
    let (mut a, mut b, mut c) = (
        connect(&etcd).await,
        connect(&etcd).await,
        connect(&etcd).await,
    );
    assert_eq!(
        leader_of(&mut a, 3, CALL).await.unwrap(),
        None,
        "nobody yet"
    );
    let first = campaign(
        &mut a,
        &mut waiter(&etcd).await,
        3,
        "http://10.0.0.1:7452",
        // Long enough that a keep-alive late on a busy machine cannot end a's lead while b
        // waits below (b must still be waiting when a resigns).
        CALL * 2,
        CALL,
    )
    .await
    .unwrap();
    assert_eq!((first.shard, first.term), (3, 1));
    let (endpoint, _) = leader_of(&mut c, 3, CALL).await.unwrap().unwrap();
    assert_eq!(endpoint, "http://10.0.0.1:7452");
    // Another shard has elections and terms of its own.
    let other = campaign(
        &mut c,
        &mut waiter(&etcd).await,
        4,
        "http://10.0.0.3:7452",
        TTL,
        CALL,
    )
    .await
    .unwrap();
    assert_eq!(other.term, 1);
    // b campaigns while a leads: it waits, longer than a call's deadline (its campaign was
    // cut off there once), and leads once a resigns.
    let mut w = waiter(&etcd).await;
    let waiting = tokio::spawn(async move {
        let won = campaign(&mut b, &mut w, 3, "http://10.0.0.2:7452", TTL, CALL).await;
        (won, b)
    });
    let mut first = first;
    let until = tokio::time::Instant::now() + CALL + Duration::from_secs(1);
    while tokio::time::Instant::now() < until {
        first.keep_alive(&mut a, CALL).await.unwrap();
        tokio::time::sleep(TTL / 4).await;
    }
    assert!(!waiting.is_finished(), "b's campaign ended while a led");
    first.resign(&mut a, CALL).await.unwrap();
    let (won, _b) = waiting.await.unwrap();
    let second = won.unwrap();
    assert_eq!(second.term, 2);
    assert_eq!(term_in_etcd(&a, 3).await, "2");
    let (endpoint, _) = leader_of(&mut a, 3, CALL).await.unwrap().unwrap();
    assert_eq!(endpoint, "http://10.0.0.2:7452");
    assert_eq!(term_in_etcd(&a, 4).await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_keeping_its_lease_loses_the_lead_to_the_next_term() {
    if skip("election lease") {
        return;
    }
    let etcd = Etcd::start(1);
    let (mut a, mut b) = (connect(&etcd).await, connect(&etcd).await);
    let mut first = campaign(&mut a, &mut waiter(&etcd).await, 0, "http://a", TTL, CALL)
        .await
        .unwrap();
    assert_eq!(first.term, 1);
    // It may grant until two thirds of its lease after etcd last confirmed it.
    assert_eq!(first.valid_until() - first.confirmed, TTL * 2 / 3);
    // It stops keeping its lease alive (it hangs, or is cut off): etcd ends it, and the
    // waiting candidate leads in term 2.
    let second = campaign(&mut b, &mut waiter(&etcd).await, 0, "http://b", TTL, CALL)
        .await
        .unwrap();
    assert_eq!(second.term, 2);
    assert!(
        std::time::Instant::now() >= first.valid_until(),
        "it had stopped granting"
    );
    let e = first.keep_alive(&mut a, CALL).await.unwrap_err();
    assert!(e.to_string().contains("expired"), "{e}");
    let (endpoint, _) = leader_of(&mut a, 0, CALL).await.unwrap().unwrap();
    assert_eq!(endpoint, "http://b");
}
