//! The broker config's tests, and `conf/broker.toml` against the compiled defaults.

use super::*;

#[test]
fn defaults_serve_loopback_7411_with_local_data() {
    let cfg = BrokerConfig::load(None, &Overrides::default()).unwrap();
    assert_eq!(cfg.broker.listen, "127.0.0.1:7411".parse().unwrap());
    assert_eq!(cfg.broker.data_dir, PathBuf::from("./data"));
    assert_eq!(cfg.default_log_config().max_batch_bytes, 1024 * 1024);
}

#[test]
fn file_values_and_overrides_apply_and_unknown_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.toml");
    std::fs::write(&path, "[broker]\nmax_batch_bytes = \"4MiB\"\n[storage]\nflush = \"sync\"\nretention = \"1h\"\n")
        .unwrap();
    let over = Overrides { listen: Some("127.0.0.1:9999".parse().unwrap()), ..Default::default() };
    let cfg = BrokerConfig::load(Some(&path), &over).unwrap();
    assert_eq!(cfg.broker.listen.port(), 9999);
    let log = cfg.default_log_config();
    assert_eq!(log.max_batch_bytes, 4 * 1024 * 1024);
    assert_eq!(log.flush, FlushPolicy::Sync);
    assert_eq!(log.retention_ms, Some(3_600_000));

    std::fs::write(&path, "[storage]\nflushh = \"sync\"\n").unwrap();
    let err = BrokerConfig::load(Some(&path), &Overrides::default()).unwrap_err().to_string();
    assert!(err.contains("flushh"), "{err}");
}

#[test]
fn the_shipped_reference_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/broker.toml");
    let cfg = BrokerConfig::load(Some(&path), &Overrides::default()).unwrap();
    assert_eq!(cfg.broker.listen, "127.0.0.1:7411".parse().unwrap());
    assert_eq!(cfg.storage.segment_age, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(cfg.default_log_config().retention_bytes, None);
}

#[test]
fn bad_cluster_id_is_named() {
    let over = Overrides { cluster_id: Some("a b".into()), ..Default::default() };
    let err = BrokerConfig::load(None, &over).unwrap_err().to_string();
    assert!(err.contains("broker.cluster_id"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = "[broker]\nmax_batch_bytes = \"512B\"\nmax_fetch_wait = \"soon\"\nlisten = 5\n[storage]\nflushh = \"sync\"\n\
                flush = \"sometimes\"\nflush_interval = \"0s\"\n[groups]\nmin_session_timeout = \"10m\"\n";
    let err = BrokerConfig::from_toml(text, false).unwrap_err();
    let ConfigError::Invalid(problems) = &err else { panic!("{err}") };
    let mut got = problems.0.clone();
    got.sort();
    assert_eq!(got.len(), 7, "{err}");
    assert_eq!(got[0], "broker.listen: invalid type: integer `5`, expected socket address");
    assert_eq!(got[1], "broker.max_batch_bytes: 512 B is outside 1KiB..256MiB");
    assert!(got[2].starts_with("broker.max_fetch_wait: \"soon\" is not a duration like"), "{err}");
    assert_eq!(got[3], "groups.min_session_timeout: is larger than groups.max_session_timeout");
    assert!(got[4].starts_with("storage.flush: \"sometimes\" is not one of \"sync\" or \"async\""), "{err}");
    assert_eq!(got[5], "storage.flush_interval: must be above 0");
    assert!(got[6].starts_with("storage.flushh: unknown key (the keys here are flush, flush_interval,"), "{err}");
    // One line, as the daemon prints errors.
    assert!(!err.to_string().contains('\n'), "{err}");
}

/// `conf/broker.toml`, the reference for every key.
fn reference() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/broker.toml")).unwrap()
}

fn loaded(text: &str) -> String {
    format!("{:?}", BrokerConfig::from_toml(text, false).unwrap_or_else(|e| panic!("{e}\nin:\n{text}")))
}

#[test]
fn every_documented_default_in_conf_broker_toml_is_the_compiled_default() {
    let documented = ferry_config::documented::defaults(&reference()).unwrap();
    let want = loaded("");
    for d in &documented {
        let doc = ferry_config::documented::with_default("", d).unwrap();
        assert_eq!(
            loaded(&doc),
            want,
            "conf/broker.toml line {}: {} is not the compiled default",
            d.line,
            d.assignment
        );
    }
    let keys: Vec<String> = documented.iter().map(|d| d.dotted()).collect();
    assert_eq!(
        keys,
        [
            "broker.listen",
            "broker.data_dir",
            "broker.max_batch_bytes",
            "broker.max_fetch_wait",
            "broker.shutdown_timeout",
            "broker.decode_concurrency",
            "storage.flush",
            "storage.flush_interval",
            "storage.flush_bytes",
            "storage.segment_bytes",
            "storage.segment_age",
            "storage.max_open_segments",
            "storage.index_interval_bytes",
            "storage.retention_bytes",
            "storage.retention",
            "storage.retention_check_interval",
            "storage.producer_id_expiration",
            "storage.max_producer_ids",
            "storage.max_timestamp_ahead",
            "groups.min_session_timeout",
            "groups.max_session_timeout",
            "groups.max_id_bytes",
            "groups.max_members",
            "groups.max_groups",
            "groups.max_metadata_bytes",
            "groups.offsets_partitions",
            "transactions.transaction_timeout",
            "transactions.check_interval",
            "transactions.max_checks",
            "transactions.max_pending",
            "transactions.max_pending_bytes",
            "transactions.max_messages",
            "transactions.resolved_retention",
            "transactions.max_resolved",
            "limits.max_topics",
            "limits.max_partitions",
            "limits.max_subscribe_partitions",
            "limits.max_concurrent_streams",
            "cluster.etcd",
            "cluster.lease_ttl",
            "cluster.replica_lag_max",
            "cluster.ack_timeout",
            "cluster.peer_addrs",
            "metrics.enabled",
            "metrics.listen",
            "kafka.auto_create_topics",
            "kafka.default_partitions",
            "kafka.max_request_bytes",
            "kafka.max_connections",
            "kafka.sasl",
            "kafka.auth_timeout",
            "delay.max_delay",
            "delay.tick",
        ],
        "every optional key with a default is documented so, once"
    );
    // A drifted default is caught.
    let drifted = reference().replace("# max_fetch_wait = \"30s\"", "# max_fetch_wait = \"31s\"");
    let d = ferry_config::documented::defaults(&drifted).unwrap().into_iter().find(|d| d.key == "max_fetch_wait");
    let doc = ferry_config::documented::with_default("", &d.unwrap()).unwrap();
    assert_ne!(loaded(&doc), want);
}

#[test]
fn conf_broker_toml_mentions_every_key_of_every_section() {
    use ferry_config::documented::fields;
    let mentioned = ferry_config::documented::mentioned(&reference()).unwrap();
    let sections: [(&str, &[&str]); 9] = [
        ("broker", fields::<BrokerSection>()),
        ("broker.tls", fields::<TlsSection>()),
        ("storage", fields::<StorageSection>()),
        ("groups", fields::<GroupsSection>()),
        ("limits", fields::<LimitsSection>()),
        ("cluster", fields::<super::ClusterSection>()),
        ("cluster.listeners", fields::<super::cluster_section::ListenerSection>()),
        ("metrics", fields::<super::MetricsSection>()),
        ("delay", fields::<super::DelaySection>()),
    ];
    let missing: Vec<String> = sections
        .iter()
        .flat_map(|(s, fs)| fs.iter().map(move |f| format!("{s}.{f}")))
        .filter(|k| !mentioned.contains(k))
        .collect();
    assert_eq!(missing, Vec::<String>::new(), "keys conf/broker.toml does not mention");
}

#[test]
fn delay_limits_are_checked() {
    for (text, key) in [
        ("[delay]\nmax_delay = \"8days\"\n", "delay.max_delay"),
        ("[delay]\nmax_delay = \"500ms\"\n", "delay.max_delay"),
        ("[delay]\ntick = \"5ms\"\n", "delay.tick"),
        ("[delay]\ntick = \"2s\"\n", "delay.tick"),
    ] {
        let e = BrokerConfig::from_toml(text, false).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
    BrokerConfig::from_toml("[delay]\nmax_delay = \"1h\"\ntick = \"50ms\"\n", false).unwrap();
}

#[test]
fn limits_must_be_above_zero() {
    let text =
        "[limits]\nmax_topics = 0\nmax_partitions = 0\nmax_subscribe_partitions = 0\nmax_concurrent_streams = 0\n";
    let err = BrokerConfig::from_toml(text, false).unwrap_err();
    let ConfigError::Invalid(problems) = &err else { panic!("{err}") };
    let mut got = problems.0.clone();
    got.sort();
    assert_eq!(
        got,
        [
            "limits.max_concurrent_streams: must be above 0",
            "limits.max_partitions: must be above 0",
            "limits.max_subscribe_partitions: must be above 0",
            "limits.max_topics: must be above 0",
        ]
    );
    let limits = BrokerConfig::from_toml("[limits]\nmax_topics = 3\n", false).unwrap().limits;
    assert_eq!(
        limits.core_limits(),
        crate::node::registry::Limits { max_topics: 3, max_partitions: 100_000, max_subscribe_partitions: 100_000 }
    );
    // The core's own defaults are the config's.
    assert_eq!(LimitsSection::default().core_limits(), crate::node::registry::Limits::default());
}

#[test]
fn a_segment_age_below_one_second_is_refused() {
    let err = BrokerConfig::from_toml("[storage]\nsegment_age = \"999ms\"\n", false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid broker config: storage.segment_age: 999ms is below the 1s minimum (a shorter age would roll a \
         segment, two files, on nearly every append)"
    );
    let ok = BrokerConfig::from_toml("[storage]\nsegment_age = \"1s\"\nmax_open_segments = 2\n", false).unwrap();
    assert_eq!((ok.default_log_config().segment_ms, ok.default_log_config().max_open_segments), (1000, 2));
    let err = BrokerConfig::from_toml("[storage]\nmax_open_segments = 0\n", false).unwrap_err();
    assert_eq!(err.to_string(), "invalid broker config: storage.max_open_segments: 0 is outside 1..4096");
}

#[test]
fn producer_and_group_bounds_are_checked_and_reach_the_broker() {
    let text = "[storage]\nproducer_id_expiration = \"999ms\"\nmax_producer_ids = 0\n[groups]\nmax_id_bytes = 63\n\
                max_members = 0\nmax_groups = 0\nmax_metadata_bytes = 1048577\n";
    let err = BrokerConfig::from_toml(text, false).unwrap_err();
    let ConfigError::Invalid(problems) = &err else { panic!("{err}") };
    let mut got = problems.0.clone();
    got.sort();
    assert_eq!(
        got,
        [
            "groups.max_groups: 0 is outside 1..1000000",
            "groups.max_id_bytes: 63 is outside 64..4096",
            "groups.max_members: 0 is outside 1..100000",
            "groups.max_metadata_bytes: 1048577 is above 1048576",
            "storage.max_producer_ids: 0 is outside 1..1000000",
            "storage.producer_id_expiration: 999ms is below the 1s minimum",
        ]
    );
    let cfg = BrokerConfig::from_toml(
        "[storage]\nproducer_id_expiration = \"1h\"\nmax_producer_ids = 3\n[groups]\nmax_id_bytes = 64\nmax_groups = 5\n\
         max_metadata_bytes = 0\n",
        false,
    )
    .unwrap();
    assert_eq!(
        cfg.producer_settings(),
        crate::node::producer_state::Settings {
            expiration_ms: 3_600_000,
            max_producers: 3,
            max_timestamp_ahead_ms: 3_600_000
        }
    );
    assert_eq!(
        cfg.groups.group_limits(),
        crate::groups::Limits { max_id_bytes: 64, max_members: 1000, max_groups: 5, max_metadata_bytes: 0 }
    );
    // The compiled defaults of the state modules are the config's.
    let defaults = BrokerConfig::default();
    assert_eq!(defaults.producer_settings(), crate::node::producer_state::Settings::default());
    assert_eq!(defaults.groups.group_limits(), crate::groups::Limits::default());
}

#[test]
fn every_bad_token_entry_is_named() {
    let text = r#"
[[auth.tokens]]
name = "orders app"
token_file = "/x"
scopes = []
topics = ["orders("]

[[auth.tokens]]
name = "ops"
token_file = "/y"
scopes = ["admin"]

[[auth.tokens]]
name = "ops"
token_file = "/z"
scopes = ["replica"]

[[auth.tokens]]
name = "typo"
token_file = "/w"
scopes = ["produse"]
topics = [".*"]
"#;
    let err = BrokerConfig::from_toml(text, false).unwrap_err();
    let ConfigError::Invalid(problems) = &err else { panic!("{err}") };
    let mut got = problems.0.clone();
    got.sort();
    assert_eq!(got.len(), 7, "{err}");
    assert_eq!(got[0], "auth.tokens[0].name: \"orders app\" must be 1-64 characters of A-Z a-z 0-9 - _ .");
    assert_eq!(
        got[1],
        "auth.tokens[0].scopes: is empty; give at least one of produce, consume, admin, mirror, replica"
    );
    assert_eq!(got[2], "auth.tokens[0].topics: pattern \"orders(\" is not a valid regex: unclosed group");
    assert!(got[3].starts_with("auth.tokens[1].topics: is empty, so the token may touch no topic"), "{err}");
    assert_eq!(got[4], "auth.tokens[2].name: \"ops\" names two tokens");
    // The unknown scope, and (as it is dropped) the list is empty.
    assert_eq!(
        got[5],
        "auth.tokens[3].scopes: is empty; give at least one of produce, consume, admin, mirror, replica"
    );
    assert!(got[6].starts_with("auth.tokens[3].scopes[0]: \"produse\" is not one of \"produce\""), "{err}");
    assert!(!err.to_string().contains('\n'), "{err}");
    // A replica-only token needs no topic; a good entry loads.
    let ok = "[[auth.tokens]]\nname = \"peer\"\ntoken_file = \"/p\"\nscopes = [\"replica\"]\n";
    assert_eq!(BrokerConfig::from_toml(ok, false).unwrap().auth.tokens.len(), 1);
}

#[test]
fn cluster_keys_are_checked_and_single_broker_mode_needs_none_of_them() {
    let single = BrokerConfig::from_toml("", false).unwrap();
    assert!(!single.cluster.enabled());
    let member = BrokerConfig::from_toml(
        "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nbroker_id = 3\nlease_ttl = \"4s\"\n",
        false,
    )
    .unwrap();
    assert_eq!(
        (member.cluster.etcd.clone(), member.cluster.broker_id, member.cluster.lease_ttl),
        (vec!["http://127.0.0.1:2379".to_owned()], Some(3), Duration::from_secs(4))
    );
    let err = BrokerConfig::from_toml(
        "[cluster]\netcd = [\"127.0.0.1:2379\"]\nlease_ttl = \"1s\"\nbroker_id = 0\nadvertised_addr = \"\"\n",
        false,
    )
    .unwrap_err()
    .to_string();
    for part in [
        "cluster.etcd: \"127.0.0.1:2379\" is not an etcd client URL",
        "cluster.broker_id: 0 is outside 1..1000000",
        "cluster.lease_ttl: 1s is outside 2s..300s",
        "cluster.advertised_addr: must be a host:port without spaces",
    ] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
    let err = BrokerConfig::from_toml("[cluster]\netcd = [\"http://127.0.0.1:2379\"]\n", false).unwrap_err();
    assert!(err.to_string().contains("cluster.broker_id: is required with cluster.etcd"), "{err}");
    // The flags set the same keys.
    let overrides =
        Overrides { etcd: Some(vec!["http://127.0.0.1:2379".into()]), broker_id: Some(7), ..Overrides::default() };
    let flagged = BrokerConfig::parse("", false, &overrides).unwrap();
    assert_eq!((flagged.cluster.etcd.len(), flagged.cluster.broker_id), (1, Some(7)));
}

#[test]
fn named_listeners_are_checked_by_name_address_and_membership() {
    let listeners = "[[cluster.listeners]]\nname = \"back up\"\naddr = \"127.0.0.1:0\"\n\
                     [[cluster.listeners]]\nname = \"backup\"\naddr = \"127.0.0.1:0\"\nadvertised = \"a b:1\"\n\
                     [[cluster.listeners]]\nname = \"backup\"\naddr = \"127.0.0.1:0\"\n";
    let err = BrokerConfig::from_toml(&format!("[cluster]\n{listeners}"), false).unwrap_err();
    let ConfigError::Invalid(problems) = &err else { panic!("{err}") };
    let mut got = problems.0.clone();
    got.sort();
    assert_eq!(
        got,
        [
            "cluster.listeners: named listeners are advertised through the cluster: set cluster.etcd too",
            "cluster.listeners[0].name: \"back up\" must be 1-64 characters of A-Z a-z 0-9 - _",
            "cluster.listeners[1].advertised: must be a host:port without spaces",
            "cluster.listeners[2].name: \"backup\" is named twice",
        ]
    );
    let good = "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nbroker_id = 1\n[[cluster.listeners]]\nname = \
                \"backup\"\naddr = \"10.9.0.11:7411\"\nadvertised = \"broker-1.backup:7411\"\n";
    let cluster = BrokerConfig::from_toml(good, false).unwrap().cluster;
    assert_eq!(cluster.listeners.len(), 1);
    let l = &cluster.listeners[0];
    assert_eq!(
        (l.name.as_str(), l.addr.to_string(), l.advertised.as_deref()),
        ("backup", "10.9.0.11:7411".to_owned(), Some("broker-1.backup:7411"))
    );
}

#[test]
fn transactions_limits_are_validated_and_named() {
    let text = "[transactions]\nmax_checks = 0\ntransaction_timeout = \"10ms\"\nmax_pending_bytes = \"1KiB\"\n";
    let err = BrokerConfig::from_toml(text, false).unwrap_err().to_string();
    for key in ["transactions.max_checks", "transactions.transaction_timeout", "transactions.max_pending_bytes"] {
        assert!(err.contains(key), "{key} not named in: {err}");
    }
}
