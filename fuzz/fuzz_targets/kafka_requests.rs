//! Feeds arbitrary bytes to the Kafka listener's request decoder (`rpc::kafka::conn::decode`: framing checks
//! against the advertised versions, then the pinned kafka-protocol codec), and every decoded Produce's records to
//! the Kafka-to-Ferry batch conversion; then drives the group decisions (`rpc::kafka::core::group`) with the
//! decoded generations, and the fetch-session decision with the decoded epochs. None may panic, loop or allocate without bound.
//!
//! The process uses the broker's global allocator (`LazyHuge`), as the broker does: the codec sizes a list by its
//! declared count before reading it, which that allocator reserves lazily; run with `-malloc_limit_mb` to see
//! whether any other allocation grows past the input's size.
#![no_main]

use bytes::Bytes;
use ferry_broker::rpc::kafka::conn::{self, Decoded};
use ferry_broker::rpc::kafka::core::{group, session};
use ferry_broker::rpc::kafka::records;
use ferry_broker::rpc::kafka::versions::Versions;
use kafka_protocol::messages::RequestKind;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: ferry_config::allocator::LazyHuge = ferry_config::allocator::LazyHuge;

fuzz_target!(|data: &[u8]| {
    let versions = Versions::ledger().expect("the compiled-in ledger parses");
    // As framed on the wire (the fuzzer's bytes are the frame after its size prefix), and with the first two
    // bytes taken as an advertised API key so that the codec, not the key check, sees most inputs.
    let mut steered = data.to_vec();
    if steered.len() >= 4 {
        let all: Vec<(i16, i16, i16)> = versions.all().collect();
        let (key, min, max) = all[usize::from(steered[0]) % all.len()];
        let version = min + i16::from(steered[1]) % (max - min + 1);
        steered[..2].copy_from_slice(&key.to_be_bytes());
        steered[2..4].copy_from_slice(&version.to_be_bytes());
    }
    for frame in [data.to_vec(), steered] {
        match conn::decode(Bytes::from(frame), &versions) {
            Decoded::Request { header, body, .. } => {
                let _ = conn::encode(header.correlation_id, kafka_protocol::messages::ApiKey::ApiVersions, 0, &{
                    kafka_protocol::messages::ResponseKind::ApiVersions(Default::default())
                });
                match *body {
                    RequestKind::Produce(p) => {
                        for t in p.topic_data {
                            for part in t.partition_data {
                                let Some(recs) = part.records else { continue };
                                if let Ok(batches) = records::split_kafka(&recs) {
                                    for b in batches {
                                        let _ = records::to_ferry(b, 1 << 20);
                                    }
                                }
                            }
                        }
                    }
                    RequestKind::Heartbeat(h) => {
                        for current in [0u64, 1, 1 << 31, (7 << 32) | 3, u64::MAX] {
                            let code = group::member_check(true, current, h.generation_id);
                            assert_eq!(code == 0, group::kafka_generation(current) == h.generation_id);
                            let g = group::commit_generation(current, h.generation_id);
                            assert_eq!(g == current, group::kafka_generation(current) == h.generation_id);
                        }
                    }
                    RequestKind::Fetch(f) => {
                        // Only full fetches (epoch 0 or -1) are answered with data; every other epoch is refused.
                        let code = session::check(f.session_epoch);
                        assert_eq!(code == 0, matches!(f.session_epoch, 0 | -1));
                    }
                    RequestKind::JoinGroup(j) => {
                        let picked = group::pick_protocol(j.protocols.iter().map(|p| p.name.as_str()));
                        assert!(picked.is_none_or(|p| !p.contains("cooperative")));
                    }
                    _ => {}
                }
            }
            Decoded::UnsupportedApiVersions { correlation_id } => {
                assert!(conn::unsupported_api_versions(correlation_id, &versions).is_ok());
            }
            Decoded::Close(why) => assert!(!why.is_empty()),
        }
    }
});
