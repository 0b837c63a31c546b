//! Mutual TLS on the sessions (`rpc::tls`), over real TLS on loopback with certificates of a
//! CA made for the test (`openssl`).

use std::sync::Arc;
use std::time::Duration;

use vqos_testkit::{openssl_missing, TestCa};

use super::{report, vif, Stepped, PERIOD_NS};
use crate::aggregator::Leader;
use crate::rpc::client::HostSession;
use crate::rpc::server::AggregatorService;
use crate::rpc::tls::{connect, RpcTls};
use crate::rpc::RpcError;

const WAIT: Duration = Duration::from_secs(5);

fn files(ca: &TestCa, (cert_file, key_file): (std::path::PathBuf, std::path::PathBuf)) -> RpcTls {
    RpcTls {
        ca_file: ca.ca_file(),
        cert_file,
        key_file,
    }
}

/// A report of `host` through a new session as `tls`'s host: the leader's answer, or why not.
async fn report_as(endpoint: &str, tls: Option<&RpcTls>, host: &str) -> Result<u64, String> {
    let channel = connect(endpoint, tls, WAIT).await?;
    let mut s = HostSession::open(channel, 0)
        .await
        .map_err(|e| e.to_string())?;
    let r = report(host, &[("vm0", vif(None, false, false))], &[]);
    s.send(&r, 7).await.map_err(|e| e.to_string())?;
    match tokio::time::timeout(WAIT, s.answer()).await {
        Ok(Ok((sent, _))) => Ok(sent),
        Ok(Err(RpcError::Identity(m))) => Err(format!("identity: {m}")),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

/// A leader serving over mutual TLS admits a host by its certificate and only as the host it
/// names; an impostor, an outsider (another CA, or no certificate) and a downgrade are each
/// refused with the reason, and the honest host is answered all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_admits_only_certified_hosts_each_as_itself() {
    if let Some(why) = openssl_missing() {
        eprintln!("SKIP a_leader_admits_only_certified_hosts_each_as_itself: {why}");
        return;
    }
    // Removed on drop, also when the test fails.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = TestCa::new(&dir.join("fleet"));
    let other_ca = TestCa::new(&dir.join("other"));
    let (node, h1, h2) = (
        files(&ca, ca.host("n1")),
        files(&ca, ca.host("h1")),
        files(&ca, ca.host("h2")),
    );
    let stranger = files(&other_ca, other_ca.host("h1"));

    let service = AggregatorService::new(Arc::new(Stepped::default())).authenticated();
    service.lead(0, Leader::new(1, 0, 4 * PERIOD_NS, 0), u64::MAX);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder()
        .tls_config(node.server().unwrap())
        .unwrap()
        .add_service(service.clone().into_server())
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    let https = format!("https://{addr}");

    // The host its certificate names: answered.
    assert_eq!(report_as(&https, Some(&h1), "h1").await, Ok(7));
    // h2's certificate reporting as h1: refused, and why.
    assert_eq!(
        report_as(&https, Some(&h2), "h1").await,
        Err("identity: the session's certificate is host 'h2's; its report says 'h1'".into())
    );
    // A certificate of another CA, named h1: no session at all.
    let e = report_as(&https, Some(&stranger), "h1").await.unwrap_err();
    assert!(!e.starts_with("identity"), "{e}");
    // No certificate (the CA trusted, nothing shown): no session either.
    let bare = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(std::fs::read(ca.ca_file()).unwrap()),
    );
    let channel = tonic::transport::Endpoint::from_shared(https.clone())
        .unwrap()
        .tls_config(bare)
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = channel {
        // TLS 1.3: the server refuses after the client's side of the handshake ended.
        let opened = HostSession::open(channel, 0).await;
        if let Ok(mut s) = opened {
            let r = report("h1", &[("vm0", vif(None, false, false))], &[]);
            let sent = s.send(&r, 7).await;
            let answer = tokio::time::timeout(WAIT, s.answer()).await;
            assert!(
                sent.is_err() || !matches!(answer, Ok(Ok(_))),
                "a host without a certificate was answered"
            );
        }
    }
    // No downgrade either way: TLS settings never go to http://, none never to https://.
    let plain = format!("http://{addr}");
    let e = connect(&plain, Some(&h1), WAIT).await.unwrap_err();
    assert!(e.contains("over TLS only"), "{e}");
    let e = connect(&https, None, WAIT).await.unwrap_err();
    assert!(e.contains("needs cluster.aggregators.ca_file"), "{e}");
    // A missing file is named.
    let mut broken = h1.clone();
    broken.key_file = dir.join("none.key");
    let e = connect(&https, Some(&broken), WAIT).await.unwrap_err();
    assert!(
        e.contains("aggregator TLS key") && e.contains("none.key"),
        "{e}"
    );
    // And the honest host is still answered.
    assert_eq!(report_as(&https, Some(&h1), "h1").await, Ok(7));
    server.abort();
}
