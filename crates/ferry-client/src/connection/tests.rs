//! Connection set-up and failover without a broker: the interceptor, TLS files, unreachable addresses.

use super::*;

#[test]
fn interceptor_sends_a_sensitive_bearer_header() {
    let mut interceptor = AuthInterceptor::new(Some("tok-123")).unwrap();
    let request = interceptor.call(tonic::Request::new(())).unwrap();
    let value = request.metadata().get("authorization").unwrap();
    assert_eq!(value.to_str().unwrap(), "Bearer tok-123");
    assert!(value.is_sensitive());
    assert!(!format!("{interceptor:?}").contains("tok-123"));
    let mut none = AuthInterceptor::new(None).unwrap();
    assert!(none.call(tonic::Request::new(())).unwrap().metadata().get("authorization").is_none());
}

#[test]
fn missing_tls_files_are_named() {
    let config = ClientConfig::default()
        .with_tls(crate::TlsOptions { ca_file: Some("/nonexistent/ca.pem".into()), ..Default::default() });
    match BrokerClient::new(config) {
        Err(ClientError::Config { field: "tls.ca_file", message }) => {
            assert!(message.contains("/nonexistent/ca.pem"), "{message}")
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn unreachable_brokers_are_tried_in_order_and_named() {
    // Two ports that nothing listens on: bind, note the port, close.
    let ports: Vec<u16> =
        (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let brokers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let client = BrokerClient::new(ClientConfig::new(brokers.clone())).unwrap();
    match client.connection().await {
        Err(ClientError::Unreachable { brokers: listed, .. }) => assert_eq!(listed, brokers.join(", ")),
        Err(other) => panic!("unexpected {other:?}"),
        Ok(_) => panic!("connected to a closed port"),
    }
    // The next round starts after the first address.
    assert_eq!(client.address(), brokers[1]);
}

#[tokio::test]
async fn a_call_to_a_dead_broker_fails_with_transport_after_retries() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut config = ClientConfig::new([format!("127.0.0.1:{port}")]);
    config.retry.initial_backoff = Duration::from_millis(1);
    config.retry.max_backoff = Duration::from_millis(2);
    let client = BrokerClient::new(config).unwrap();
    let err = client.metadata().await.unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[tokio::test]
async fn leaders_of_many_partitions_are_learnt_and_looked_up_together_as_one_at_a_time() {
    let client = BrokerClient::new(ClientConfig::new(["127.0.0.1:1"])).unwrap();
    client.learn_leaders("127.0.0.1:2", [("a", 0, 3), ("a", 1, 3), ("b", 0, 1)]);
    assert!(client.learn_leader("a", 2, 5, "127.0.0.1:3"));
    // An older epoch and an empty address teach nothing.
    client.learn_leaders("127.0.0.1:9", [("a", 0, 2)]);
    client.learn_leaders("", [("b", 0, 7)]);
    let asked = [("a", 0), ("b", 0), ("a", 2), ("c", 0), ("a", 1), ("b", 1)];
    let (clients, placed) = client.leaders_for(asked);
    let addresses: Vec<String> = clients.iter().map(BrokerClient::address).collect();
    assert_eq!(addresses, ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:1"]);
    assert_eq!(placed, [(0, 3), (0, 1), (1, 5), (2, 0), (0, 3), (2, 0)]);
    // Each the same as asked one at a time: the same client (connection) and epoch.
    for ((topic, partition), (at, epoch)) in asked.into_iter().zip(placed) {
        let (one, known) = client.leader_for(topic, partition);
        assert!(one.is_same(&clients[at]), "{topic}/{partition}");
        assert_eq!(known, Some(epoch).filter(|e| *e > 0), "{topic}/{partition}");
    }
    // A partition unknown to all: this client, once.
    let (clients, placed) = client.leaders_for([("x", 0), ("y", 1)]);
    assert_eq!((clients.len(), placed), (1, vec![(0, 0), (0, 0)]));
    assert!(clients[0].is_same(&client));
}
