//! The Monitor over real HTTP: a `MirrorHandle` built in-process with known state (no brokers, except where a
//! healthy route needs a real one), the server on 127.0.0.1:0, and every answer checked for exact values and
//! against docs/openapi.yaml.
//!
//! One test binary; the modules group the tests by what they check: `rest` the read endpoints, the error shape and
//! the OpenAPI document, `auth` the token and the audit log of mutating calls, `metrics` the exposition and the
//! queries of the shipped dashboard and alert rules, `serving` readiness against a real broker, TLS, shutdown and
//! bootstrap, `dashboard` the page in headless Chromium. `harness` builds the handle and the server.

mod auth;
mod dashboard;
mod harness;
mod metrics;
mod openapi;
mod rest;
mod serving;
