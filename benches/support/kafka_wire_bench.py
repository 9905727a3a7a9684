#!/usr/bin/env python3
"""confluent-kafka load for benches/kafka_wire.rs.

usage: kafka_wire_bench.py BOOTSTRAP produce TOPIC PARTITIONS COUNT SIZE
       kafka_wire_bench.py BOOTSTRAP consume TOPIC PARTITIONS COUNT
Prints one line: the seconds from the first send (or the consumer's start) to the last acknowledgement (or record).
"""
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap, cmd, topic, parts, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if cmd == "produce":
    value = b"x" * int(sys.argv[6])
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "batch.size": 1 << 20, "queue.buffering.max.messages": 1000000,
                  "queue.buffering.max.kbytes": 1 << 21, "compression.type": "none"})
    failed = []
    def cb(err, _m):
        if err is not None:
            failed.append(err)
    start = time.monotonic()
    for i in range(count):
        while True:
            try:
                p.produce(topic, value=value, key=b"key-%d" % i, partition=i % parts, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(300)
    elapsed = time.monotonic() - start
    if failed or left:
        sys.exit(f"{len(failed)} deliveries failed ({failed[:1]}), {left} unflushed")
    print(elapsed)
else:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 1 << 24, "max.partition.fetch.bytes": 1 << 22})
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    start = time.monotonic()
    n = 0
    while n < count:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                n += 1
    elapsed = time.monotonic() - start
    c.close()
    print(elapsed)
