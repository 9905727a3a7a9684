//! `Admin::list_offsets_aligned` against a broker built before `ListOffsetsRequest.columns` existed. Such a broker
//! reads the columns ask as an ask for no partitions and answers with nothing; the client must notice, ask the
//! same partitions again flat (one entry per partition, each naming its topic), return the flat answers, and ask
//! flat directly on every later call. The old broker is a hand-written gRPC service in this file that knows only
//! field 1 of the request and of the response.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use ferry_client::proto::{ErrorCode, ListOffsetsPartition, ListOffsetsResult};
use ferry_client::{Admin, BrokerClient, ClientConfig, OffsetSpec};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{Grpc, NamedService, UnaryService};

/// `ListOffsetsRequest` as an old broker knows it: no `columns` (field 2).
#[derive(Clone, PartialEq, prost::Message)]
struct OldListOffsetsRequest {
    #[prost(message, repeated, tag = "1")]
    partitions: Vec<ListOffsetsPartition>,
}

/// `ListOffsetsResponse` as an old broker knows it: no `columns` (field 2).
#[derive(Clone, PartialEq, prost::Message)]
struct OldListOffsetsResponse {
    #[prost(message, repeated, tag = "1")]
    partitions: Vec<ListOffsetsResult>,
}

/// A broker that serves only ListOffsets, in the old form, and records how many partitions each ask carried.
#[derive(Clone, Default)]
struct OldBroker {
    asks: Arc<Mutex<Vec<usize>>>,
}

impl OldBroker {
    /// The partition counts of the asks seen so far, in order.
    fn asks(&self) -> Vec<usize> {
        self.asks.lock().unwrap().clone()
    }
}

/// The old broker's answer for one asked partition: offsets derived from its topic and number, so that each
/// answer is told apart from the others.
fn answer(asked: ListOffsetsPartition) -> ListOffsetsResult {
    let log_end = 100 * u64::from(asked.partition) + asked.topic.len() as u64;
    ListOffsetsResult {
        partition: asked.partition,
        topic: asked.topic,
        error: ErrorCode::None as i32,
        log_start_offset: asked.partition.into(),
        log_end_offset: log_end,
        stored_end_offset: log_end,
        offset: Some(log_end),
        ..Default::default()
    }
}

impl UnaryService<OldListOffsetsRequest> for OldBroker {
    type Response = OldListOffsetsResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<OldListOffsetsRequest>) -> Self::Future {
        let asked = request.into_inner().partitions;
        self.asks.lock().unwrap().push(asked.len());
        let partitions = asked.into_iter().map(answer).collect();
        Box::pin(async move { Ok(tonic::Response::new(OldListOffsetsResponse { partitions })) })
    }
}

impl Service<http::Request<Body>> for OldBroker {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let broker = self.clone();
        Box::pin(async move {
            if request.uri().path() == "/ferry.v1.Broker/ListOffsets" {
                let mut grpc = Grpc::new(tonic_prost::ProstCodec::default());
                return Ok(grpc.unary(broker, request).await);
            }
            // Any other method: UNIMPLEMENTED, as generated servers answer an unknown path.
            Ok(tonic::Status::unimplemented("not served by this old broker").into_http())
        })
    }
}

impl NamedService for OldBroker {
    const NAME: &'static str = "ferry.v1.Broker";
}

/// Starts `broker` on a free local port; returns its address.
async fn serve(broker: OldBroker) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tonic::transport::Server::builder().add_service(broker);
    tokio::spawn(server.serve_with_incoming(TcpListenerStream::new(listener)));
    address
}

/// Each answer's (partition, log_start_offset, log_end_offset, offset); panics on a missing or failed one.
fn offsets(answers: Vec<Option<ferry_client::Result<ListOffsetsResult>>>) -> Vec<(u32, u64, u64, Option<u64>)> {
    answers
        .into_iter()
        .map(|answer| {
            let r = answer.expect("every partition answered").expect("no partition failed");
            (r.partition, r.log_start_offset, r.log_end_offset, r.offset)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_falls_back_to_flat_asks_at_a_broker_without_columns() {
    let broker = OldBroker::default();
    let address = serve(broker.clone()).await;
    let client = BrokerClient::connect(ClientConfig::new([address])).await.expect("connect to the old broker");
    let admin = Admin::new(client);

    let first = admin
        .list_offsets_aligned(&[
            ("orders", 0, OffsetSpec::Latest),
            ("orders", 1, OffsetSpec::Latest),
            ("audit", 2, OffsetSpec::Latest),
        ])
        .await
        .expect("first ListOffsets");
    assert_eq!(offsets(first), vec![(0, 0, 6, Some(6)), (1, 1, 106, Some(106)), (2, 2, 205, Some(205))]);
    // The columns ask, read by the old broker as an ask for no partitions, then the same three asked flat.
    assert_eq!(broker.asks(), vec![0, 3]);

    let second = admin
        .list_offsets_aligned(&[("audit", 3, OffsetSpec::Latest), ("orders", 7, OffsetSpec::Latest)])
        .await
        .expect("second ListOffsets");
    assert_eq!(offsets(second), vec![(3, 3, 305, Some(305)), (7, 7, 706, Some(706))]);
    // Flat straight away: no second columns try.
    assert_eq!(broker.asks(), vec![0, 3, 2]);
}
