"""Kafka-side data for the mirror's Kafka tests, through confluent-kafka (librdkafka's Python binding), so the data
on the Kafka side is never produced or read by the code under test.

Every record is printed as one JSON line: {"p", "o", "ts", "k", "v", "h"} with key, value and header values in
base64 (null kept) and headers as an ordered list of [key, value]. Subcommands:

  produce BOOTSTRAP TOPIC PARTITION COUNT SEED [--txn ID] [--abort-every N] [--size N]
      deterministic keyed records with headers (repeated keys, null values) and timestamps; prints every record
      as produced, at the offset its delivery report gave, in offset order; a record of an aborted transaction
      carries "aborted": true (the producer's own account, so that tests need not trust the broker to hide them)
  consume BOOTSTRAP TOPIC PARTITION FROM [--max N] [--uncommitted]
      every visible record from FROM to the end (read_committed unless --uncommitted)
  hold BOOTSTRAP TOPIC PARTITION TXN_ID HEADERS_JSON COUNT BASE
      a transactional producer that writes COUNT records with the given headers ("{o}" in a value becomes BASE + i)
      in a transaction, never commits, prints "ready" and waits to be killed (a mirror killed mid-transaction)
  load BOOTSTRAP TOPIC PARTITIONS COUNT SIZE
      COUNT keyed records of SIZE-byte values spread over the partitions, as fast as possible (benchmarks)
  create BOOTSTRAP TOPIC PARTITIONS
  delete BOOTSTRAP TOPIC
  commit BOOTSTRAP GROUP TOPIC PARTITION OFFSET
  committed BOOTSTRAP GROUP TOPIC PARTITION
"""
import base64
import json
import signal
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def b64(b):
    return None if b is None else base64.b64encode(b).decode()


def line(m):
    ts_type, ts = m.timestamp()
    return json.dumps({
        "p": m.partition(), "o": m.offset(), "ts": ts, "k": b64(m.key()), "v": b64(m.value()),
        "h": [[k, b64(v)] for k, v in (m.headers() or [])],
    })


def record(seed, i, size):
    key = None if i % 7 == 3 else f"key-{seed}-{i % 11}".encode()
    value = None if i % 13 == 5 else (f"value-{seed}-{i}-".encode() + bytes([i % 256]) * (i % size))
    headers = [("trace", f"t{i}".encode()), ("dup", b"a"), ("dup", None if i % 2 else b"b")] if i % 5 else []
    return key, value, headers, 1_700_000_000_000 + seed * 1_000_000 + i * 7


def produce(bootstrap, topic, partition, count, seed, txn=None, abort_every=0, size=64):
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    if txn:
        conf["transactional.id"] = txn
    p = Producer(conf)
    # (offset, record index) of every delivered record, and the indexes of the aborted ones. A delivery report
    # carries no headers, so what is printed is the record as produced, at the offset its report gave.
    delivered = []
    aborted = set()

    def on_delivery(j):
        def done(err, msg):
            if err is not None:
                raise SystemExit(f"delivery failed: {err}")
            delivered.append((msg.offset(), j))
        return done

    if txn:
        p.init_transactions(30)
    i = 0
    chunk = 10
    while i < count:
        n = min(chunk, count - i)
        if txn:
            p.begin_transaction()
        for j in range(i, i + n):
            key, value, headers, ts = record(seed, j, size)
            p.produce(topic, value=value, key=key, headers=headers, partition=partition, timestamp=ts,
                      on_delivery=on_delivery(j))
        if p.flush(30) != 0:
            raise SystemExit("produce: records left undelivered")
        abort = txn and abort_every and (i // chunk) % abort_every == abort_every - 1
        if txn:
            if abort:
                p.abort_transaction(30)
                aborted.update(range(i, i + n))
            else:
                p.commit_transaction(30)
        i += n
    if len(delivered) != count:
        raise SystemExit(f"produce: {len(delivered)} of {count} records delivered")
    for offset, j in sorted(delivered):
        key, value, headers, ts = record(seed, j, size)
        out = {"p": partition, "o": offset, "ts": ts, "k": b64(key), "v": b64(value),
               "h": [[k, b64(v)] for k, v in headers]}
        if j in aborted:
            out["aborted"] = True
        print(json.dumps(out))


def load(bootstrap, topic, partitions, count, size):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.kbytes": 1 << 20})
    value = b"x" * size
    for i in range(count):
        while True:
            try:
                p.produce(topic, value=value, key=f"key-{i}".encode(), partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise SystemExit("load: records left undelivered")


def consume(bootstrap, topic, partition, start, max_n=None, committed=True):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-tool-reader", "enable.auto.commit": False,
                  "isolation.level": "read_committed" if committed else "read_uncommitted",
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    if hi <= start:
        return
    c.assign([TopicPartition(topic, partition, start)])
    n = 0
    deadline = time.time() + 60
    while time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                break
            raise SystemExit(f"consume failed: {m.error()}")
        print(line(m))
        n += 1
        if max_n is not None and n >= max_n:
            break
    c.close()


def hold(bootstrap, topic, partition, txn, headers_json, count, base):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn})
    p.init_transactions(30)
    p.begin_transaction()
    extra = json.loads(headers_json)
    for i in range(count):
        headers = [(k, v.replace("{o}", str(base + i)).encode()) for k, v in extra]
        p.produce(topic, value=f"zombie-{i}".encode(), partition=partition, headers=headers)
    p.flush(30)
    print("ready", flush=True)
    # Held open mid-transaction until the test kills this process.
    signal.pause()


def main(argv):
    cmd = argv[0]
    if cmd == "produce":
        bootstrap, topic, partition, count, seed = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
        opts = dict(zip(argv[6::2], argv[7::2]))
        produce(bootstrap, topic, partition, count, seed, opts.get("--txn"), int(opts.get("--abort-every", 0)),
                int(opts.get("--size", 64)))
    elif cmd == "consume":
        bootstrap, topic, partition, start = argv[1], argv[2], int(argv[3]), int(argv[4])
        rest = argv[5:]
        max_n = int(rest[rest.index("--max") + 1]) if "--max" in rest else None
        consume(bootstrap, topic, partition, start, max_n, "--uncommitted" not in rest)
    elif cmd == "hold":
        hold(argv[1], argv[2], int(argv[3]), argv[4], argv[5], int(argv[6]), int(argv[7]))
    elif cmd == "load":
        load(argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5]))
    elif cmd == "create":
        a = AdminClient({"bootstrap.servers": argv[1]})
        for _, f in a.create_topics([NewTopic(argv[2], int(argv[3]), 1)]).items():
            f.result()
    elif cmd == "delete":
        a = AdminClient({"bootstrap.servers": argv[1]})
        for _, f in a.delete_topics([argv[2]]).items():
            f.result()
    elif cmd == "commit":
        c = Consumer({"bootstrap.servers": argv[1], "group.id": argv[2], "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(argv[3], int(argv[4]), int(argv[5]))], asynchronous=False)
        c.close()
    elif cmd == "committed":
        c = Consumer({"bootstrap.servers": argv[1], "group.id": argv[2], "enable.auto.commit": False})
        got = c.committed([TopicPartition(argv[3], int(argv[4]))], timeout=10)
        print(got[0].offset)
        c.close()
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
