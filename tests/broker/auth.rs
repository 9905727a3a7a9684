//! Bearer-token auth: with `FERRY_BROKER_TOKEN` set, calls need the token; the gRPC health service stays open.

use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, Code};
use ferry_testkit::BrokerProcess;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::common::assert_status;

const TOKEN: &str = "s3cret-broker-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_need_the_token_but_health_does_not() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let broker = BrokerProcess::builder().env("FERRY_BROKER_TOKEN", TOKEN).start().await?;
    let config = ClientConfig::new([broker.addr().to_string()]);

    // No token, and a wrong token: UNAUTHENTICATED, saying what to send; nothing is created.
    let anonymous = Admin::new(BrokerClient::new(config.clone())?);
    assert_status(anonymous.metadata().await, Code::Unauthenticated, &["bearer token"]);
    assert_status(
        anonymous.create_topic("secret", 1, TopicConfig::default(), None).await,
        Code::Unauthenticated,
        &["bearer token"],
    );
    let wrong = Admin::new(BrokerClient::new(config.clone().with_token("not-the-token"))?);
    assert_status(wrong.list_topics().await, Code::Unauthenticated, &["bearer token"]);

    // The right token works.
    let admin = Admin::new(BrokerClient::new(config.clone().with_token(TOKEN))?);
    assert_eq!(admin.metadata().await?.cluster_id, broker.cluster_id());
    admin.create_topic("secret", 1, TopicConfig::default(), None).await?;
    let names: Vec<String> = admin.list_topics().await?.into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["secret"]);

    // The health service answers without a token.
    let channel = anonymous.client().channel().await?;
    let health = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await?.into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);
    let named = HealthClient::new(anonymous.client().channel().await?)
        .check(HealthCheckRequest { service: "ferry.v1.Broker".into() })
        .await?
        .into_inner();
    assert_eq!(named.status, ServingStatus::Serving as i32);
    Ok(())
}
