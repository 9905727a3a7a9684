//! End-to-end tests of `ferry-console`: a real broker and the real console binary, through its JSON API and a
//! headless Chromium.

mod actions;
mod browse;
mod cdp;
mod common;
mod forward;
mod groups;
mod idempotent;
mod openapi;
mod overview;
mod pages;
mod paging;
mod provenance;
mod trace;
