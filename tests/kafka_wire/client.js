#!/usr/bin/env node
// Drives kafkajs (from npm) against a Kafka-protocol broker for the kafka_wire tests: the same commands and JSON
// lines as client.py (see there). kafkajs is found through NODE_PATH (scripts/test.sh installs it under
// target/npm).
'use strict';
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const [lib, bootstrap, cmd, ...args] = process.argv.slice(2);
if (lib !== 'kafkajs') throw new Error(`client.js drives kafkajs, not ${lib}`);
const kafka = new Kafka({ clientId: `kjs-${process.pid}`, brokers: [bootstrap], logLevel: logLevel.NOTHING,
  retry: { retries: 8, initialRetryTime: 100 } });

function record(tag, i) {
  return {
    key: `${tag}-k${i % 7}`,
    value: `${tag}-v${i}-${'x'.repeat(i % 13)}`,
    headers: { seq: [String(i), `again-${i}`], tag },
    timestamp: String(1750000000000 + i),
  };
}

function rec(partition, m) {
  const h = [];
  for (const [k, v] of Object.entries(m.headers || {})) {
    for (const x of Array.isArray(v) ? v : [v]) h.push([k, x === null || x === undefined ? null : x.toString()]);
  }
  return { rec: { p: partition, o: Number(m.offset), k: m.key === null ? null : m.key.toString(),
    v: m.value === null ? null : m.value.toString(), h, ts: Number(m.timestamp) } };
}

async function produce(topic, parts, tag, lo, hi) {
  const p = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await p.connect();
  let acked = 0;
  for (let at = lo; at < hi; at += 50) {
    const messages = [];
    for (let i = at; i < Math.min(at + 50, hi); i++) messages.push({ ...record(tag, i), partition: i % parts });
    await p.send({ topic, acks: -1, messages });
    acked += messages.length;
  }
  await p.disconnect();
  out({ acked, unflushed: 0 });
}

async function consume(topic, group, until, member) {
  const c = kafka.consumer({ groupId: group, sessionTimeout: 6000, heartbeatInterval: 300, rebalanceTimeout: 6000,
    maxWaitTimeInMs: 200 });
  c.on(c.events.GROUP_JOIN, (e) => {
    const a = e.payload.memberAssignment[topic] || [];
    out({ assigned: [...a].sort((x, y) => x - y) });
  });
  await c.connect();
  await c.subscribe({ topic, fromBeginning: true });
  let n = 0;
  let done;
  const finished = new Promise((r) => { done = r; });
  await c.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      if (!member && n >= until) return;
      await c.commitOffsets([{ topic, partition, offset: String(Number(message.offset) + 1) }]);
      out(rec(partition, message));
      n += 1;
      if (!member && n >= until) done();
    },
  });
  if (member) {
    await new Promise((r) => {
      const t = setInterval(() => { if (fs.existsSync(until)) { clearInterval(t); r(); } }, 100);
    });
  } else {
    await finished;
  }
  await c.disconnect();
  out({ closed: n });
}

async function admin(topic) {
  const a = kafka.admin();
  await a.connect();
  const res = {};
  if (await a.createTopics({ topics: [{ topic, numPartitions: 3, replicationFactor: 1 }], waitForLeaders: true })) {
    res.created = topic;
  }
  res.again = (await a.createTopics({ topics: [{ topic, numPartitions: 3, replicationFactor: 1 }] }))
    ? 'created' : 'TOPIC_ALREADY_EXISTS';
  await a.createPartitions({ topicPartitions: [{ topic, count: 5 }] });
  res.grown = topic;
  const md = await a.fetchTopicMetadata({ topics: [topic] });
  res.partitions = md.topics[0].partitions.length;
  out({ admin: res });
  await a.deleteTopics({ topics: [topic] });
  out({ deleted: topic });
  await a.disconnect();
}

async function inspect(topic, group) {
  const a = kafka.admin();
  await a.connect();
  const res = { listed: (await a.listGroups()).groups.some((g) => g.groupId === group) };
  res.state = (await a.describeGroups([group])).groups[0].state.toLowerCase();
  const d = await a.describeConfigs({ resources: [{ type: 2, name: topic, configNames: ['retention.ms'] }],
    includeSynonyms: false });
  res.before = d.resources[0].configEntries.find((e) => e.configName === 'retention.ms').configValue;
  out({ inspect: res });
  await a.disconnect();
}

(async () => {
  if (cmd === 'produce') await produce(args[0], Number(args[1]), args[2], Number(args[3]), Number(args[4]));
  else if (cmd === 'member') await consume(args[0], args[1], args[2], true);
  else if (cmd === 'consume') await consume(args[0], args[1], Number(args[2]), false);
  else if (cmd === 'admin') await admin(args[0]);
  else if (cmd === 'inspect') await inspect(args[0], args[1]);
  else throw new Error(`unknown command ${cmd}`);
  process.exit(0);
})().catch((e) => { out({ error: String((e && e.stack) || e) }); process.exit(1); });
