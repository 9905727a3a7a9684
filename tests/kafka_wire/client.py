#!/usr/bin/env python3
"""Drives a stock Kafka client (client.js: the same for kafkajs) against a Kafka-protocol broker for the kafka_wire tests.

usage: client.py LIB BOOTSTRAP COMMAND ARGS...
  LIB: confluent (confluent-kafka, librdkafka) or kafkapython (kafka-python)
  produce TOPIC PARTITIONS TAG FROM TO   idempotent, acks=all; record i goes to partition i % PARTITIONS
  stream TOPIC PARTITIONS TAG FIRST TO    as produce (confluent only), each acknowledgement printed as
                                          {"ack": [i, partition, offset]}: records 0..FIRST flushed, then
                                          {"ready": FIRST}, then FIRST..TO a record every 5 ms
  member TOPIC GROUP STOPFILE             consumes in GROUP, committing each record (metadata "m<offset>") before
                                          the next, until STOPFILE exists; then leaves the group. With
                                          COMMIT_FAILURES=report (confluent), a failed commit is printed as
                                          {"commit_failed": [partition, offset, error]} and consuming goes on
  consume TOPIC GROUP COUNT               consumes COUNT records in GROUP, committing each; then leaves
  metadata TOPIC                          (confluent) prints {"metadata": {"brokers": [[id, "host:port"], ...],
                                          "partitions": [[p, leader, [replicas], [isr]], ...]}}
  times TOPIC PARTITIONS T...              the first offset at or after each time T in each partition (ListOffsets):
                                          {"times": [[partition, T, offset or -1, timestamp or null], ...]}
  delete-group GROUP                      (confluent) deletes GROUP: {"delete_group": "ok" or Kafka's error name}
  admin TOPIC                             creates TOPIC (3 partitions), grows it to 5, lists it, deletes it
  inspect TOPIC GROUP                     lists and describes groups, describes TOPIC's retention.ms (and, with
                                          confluent, sets it to 3600000 and describes it again)
Prints one JSON object a line: {"rec": ...}, {"assigned": [...]}, {"acked": n}, {"admin": ...}, {"error": ...}.
Record i of TAG: key TAG-k(i%7), value TAG-v<i>-x*(i%13), headers seq=i, seq=again-i, tag=TAG, timestamp
1750000000000+i.
"""
import json
import os
import sys
import time


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def record(tag, i):
    headers = [("seq", str(i).encode()), ("seq", f"again-{i}".encode()), ("tag", tag.encode())]
    return f"{tag}-k{i % 7}".encode(), f"{tag}-v{i}-{'x' * (i % 13)}".encode(), headers, 1750000000000 + i


def rec(partition, offset, key, value, headers, ts):
    return {"rec": {"p": partition, "o": offset, "k": key.decode() if key is not None else None,
                    "v": value.decode() if value is not None else None,
                    "h": [[k, v.decode() if v is not None else None] for k, v in (headers or [])], "ts": ts}}


def extra():
    """Settings every confluent-kafka client also gets (KAFKA_CLIENT_CONFIG, JSON): security, timeouts."""
    return json.loads(os.environ.get("KAFKA_CLIENT_CONFIG", "{}"))


class Confluent:
    def __init__(self, bootstrap):
        import confluent_kafka
        self.ck = confluent_kafka
        self.b = bootstrap

    def produce(self, topic, parts, tag, lo, hi):
        p = self.ck.Producer({"bootstrap.servers": self.b, "enable.idempotence": True, "acks": "all",
                              "linger.ms": 5, **extra()})
        acked = []
        def cb(err, m):
            if err is None:
                acked.append(1)
            else:
                out({"error": str(err)})
        for i in range(lo, hi):
            k, v, h, ts = record(tag, i)
            p.produce(topic, key=k, value=v, headers=h, timestamp=ts, partition=i % parts, on_delivery=cb)
            p.poll(0)
        left = p.flush(60)
        out({"acked": len(acked), "unflushed": left})

    def stream(self, topic, parts, tag, first, hi):
        p = self.ck.Producer({"bootstrap.servers": self.b, "enable.idempotence": True, "acks": "all",
                              "linger.ms": 5, **extra()})
        acked = []
        def cb(err, m, i):
            if err is None:
                acked.append(1)
                out({"ack": [i, m.partition(), m.offset()]})
            else:
                out({"error": str(err)})
        for i in range(0, hi):
            if i == first:
                p.flush(60)
                out({"ready": first})
            k, v, h, ts = record(tag, i)
            p.produce(topic, key=k, value=v, headers=h, timestamp=ts, partition=i % parts,
                      on_delivery=lambda err, m, i=i: cb(err, m, i))
            p.poll(0)
            if i >= first:
                # Pacing, not waiting: the rest of the records go out at about 200 a second, so the test's fault
                # (a broker change) lands while this producer is mid-stream. No condition stands in for it.
                time.sleep(0.005)
        left = p.flush(90)
        out({"acked": len(acked), "unflushed": left})

    def consumer(self, topic, group):
        c = self.ck.Consumer({"bootstrap.servers": self.b, "group.id": group, "auto.offset.reset": "earliest",
                              "enable.auto.commit": False, "session.timeout.ms": 6000,
                              "heartbeat.interval.ms": 300, "client.id": f"ck-{os.getpid()}", **extra()})
        def on_assign(cons, parts):
            out({"assigned": sorted(tp.partition for tp in parts)})
        c.subscribe([topic], on_assign=on_assign)
        return c

    def poll(self, c, topic):
        m = c.poll(0.2)
        if m is None:
            return None
        if m.error():
            out({"error": str(m.error())})
            return None
        tp = self.ck.TopicPartition(topic, m.partition(), m.offset() + 1, metadata=f"m{m.offset()}")
        try:
            c.commit(offsets=[tp], asynchronous=False)
        except self.ck.KafkaException as e:
            if os.environ.get("COMMIT_FAILURES") != "report":
                raise
            out({"commit_failed": [m.partition(), m.offset(), str(e)]})
        return rec(m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1])

    def close(self, c):
        c.close()

    def admin(self, topic):
        from confluent_kafka.admin import AdminClient, NewTopic, NewPartitions
        a = AdminClient({"bootstrap.servers": self.b})
        res = {}
        for t, f in a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)]).items():
            f.result(); res["created"] = t
        for t, f in a.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)]).items():
            try:
                f.result(); res["again"] = "created"
            except self.ck.KafkaException as e:
                res["again"] = e.args[0].name()
        for t, f in a.create_partitions([NewPartitions(topic, 5)]).items():
            f.result(); res["grown"] = t
        md = a.list_topics(topic, timeout=10)
        res["partitions"] = len(md.topics[topic].partitions)
        out({"admin": res})
        for t, f in a.delete_topics([topic]).items():
            f.result()
        out({"deleted": topic})


    def times(self, topic, parts, times):
        c = self.ck.Consumer({"bootstrap.servers": self.b, "group.id": "times", **extra()})
        res = []
        for t in times:
            asked = [self.ck.TopicPartition(topic, p, t) for p in range(parts)]
            for tp in c.offsets_for_times(asked, timeout=20):
                if tp.error:
                    out({"error": str(tp.error)})
                res.append([tp.partition, t, tp.offset, None])
        c.close()
        out({"times": sorted(res)})

    def delete_group(self, group):
        from confluent_kafka.admin import AdminClient
        a = AdminClient({"bootstrap.servers": self.b, **extra()})
        try:
            for f in a.delete_consumer_groups([group], request_timeout=20).values():
                f.result()
            out({"delete_group": "ok"})
        except self.ck.KafkaException as e:
            out({"delete_group": e.args[0].name()})

    def metadata(self, topic):
        from confluent_kafka.admin import AdminClient
        md = AdminClient({"bootstrap.servers": self.b}).list_topics(topic, timeout=20)
        brokers = sorted([b.id, f"{b.host}:{b.port}"] for b in md.brokers.values())
        parts = sorted([p.id, p.leader, sorted(p.replicas), sorted(p.isrs)]
                       for p in md.topics[topic].partitions.values())
        out({"metadata": {"brokers": brokers, "partitions": parts}})

    def inspect(self, topic, group):
        from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
        a = AdminClient({"bootstrap.servers": self.b})
        res = {"listed": group in [g.group_id for g in a.list_consumer_groups().result(30).valid]}
        res["state"] = a.describe_consumer_groups([group])[group].result(30).state.name.lower()
        r = ConfigResource(ResourceType.TOPIC, topic)
        describe = lambda: [f.result(30) for f in a.describe_configs([r]).values()][0]["retention.ms"].value
        res["before"] = describe()
        change = ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)
        for f in a.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, topic,
                                                             incremental_configs=[change])]).values():
            f.result(30)
        res["after"] = describe()
        out({"inspect": res})


class KafkaPython:
    def __init__(self, bootstrap):
        import kafka
        self.k = kafka
        self.b = bootstrap

    def produce(self, topic, parts, tag, lo, hi):
        p = self.k.KafkaProducer(bootstrap_servers=self.b, enable_idempotence=True, acks="all", linger_ms=5)
        futs = []
        for i in range(lo, hi):
            k, v, h, ts = record(tag, i)
            futs.append(p.send(topic, key=k, value=v, headers=h, timestamp_ms=ts, partition=i % parts))
        p.flush(60)
        acked = 0
        for f in futs:
            try:
                f.get(timeout=60); acked += 1
            except Exception as e:
                out({"error": repr(e)})
        p.close()
        out({"acked": acked, "unflushed": 0})

    def consumer(self, topic, group):
        from kafka import ConsumerRebalanceListener
        class L(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                pass
            def on_partitions_assigned(self, assigned):
                out({"assigned": sorted(tp.partition for tp in assigned)})
        c = self.k.KafkaConsumer(bootstrap_servers=self.b, group_id=group, auto_offset_reset="earliest",
                                 enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=300,
                                 max_poll_records=1, client_id=f"kp-{os.getpid()}")
        c.subscribe([topic], listener=L())
        self.buffer = []
        return c

    def poll(self, c, topic):
        if not self.buffer:
            for _, ms in c.poll(200).items():
                self.buffer.extend(ms)
        if not self.buffer:
            return None
        m = self.buffer.pop(0)
        from kafka.structs import OffsetAndMetadata, TopicPartition
        c.commit({TopicPartition(topic, m.partition): OffsetAndMetadata(m.offset + 1, f"m{m.offset}", -1)})
        return rec(m.partition, m.offset, m.key, m.value, m.headers, m.timestamp)

    def close(self, c):
        c.close()

    def admin(self, topic):
        from kafka.admin import KafkaAdminClient, NewTopic, NewPartitions
        from kafka.errors import TopicAlreadyExistsError
        a = KafkaAdminClient(bootstrap_servers=self.b)
        res = {}
        a.create_topics([NewTopic(topic, 3, 1)])
        res["created"] = topic
        try:
            a.create_topics([NewTopic(topic, 3, 1)]); res["again"] = "created"
        except TopicAlreadyExistsError:
            res["again"] = "TOPIC_ALREADY_EXISTS"
        a.create_partitions({topic: NewPartitions(5)})
        res["grown"] = topic
        res["partitions"] = len(a.describe_topics([topic])[0]["partitions"])
        out({"admin": res})
        a.delete_topics([topic])
        out({"deleted": topic})
        a.close()


def kp_times(self, topic, parts, times):
    from kafka.structs import TopicPartition
    c = self.k.KafkaConsumer(bootstrap_servers=self.b)
    res = []
    for t in times:
        found = c.offsets_for_times({TopicPartition(topic, p): t for p in range(parts)})
        for tp, ot in found.items():
            res.append([tp.partition, t, ot.offset if ot else -1, ot.timestamp if ot else None])
    c.close()
    out({"times": sorted(res)})


KafkaPython.times = kp_times


def kp_inspect(self, topic, group):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
    a = KafkaAdminClient(bootstrap_servers=self.b)
    res = {"listed": group in [g["group_id"] for g in a.list_groups()]}
    res["state"] = a.describe_groups([group])[group]["group_state"].lower()
    configs = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    res["before"] = configs["topic"][topic]["retention.ms"]["value"]
    a.close()
    out({"inspect": res})


KafkaPython.inspect = kp_inspect


def main():
    lib, bootstrap, cmd, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    c = {"confluent": Confluent, "kafkapython": KafkaPython}[lib](bootstrap)
    if cmd == "produce":
        topic, parts, tag, lo, hi = args
        c.produce(topic, int(parts), tag, int(lo), int(hi))
    elif cmd == "stream":
        topic, parts, tag, first, hi = args[:5]
        c.stream(topic, int(parts), tag, int(first), int(hi))
    elif cmd in ("member", "consume"):
        topic, group, until = args
        cons = c.consumer(topic, group)
        n = 0
        while (os.path.exists(until) is False) if cmd == "member" else (n < int(until)):
            r = c.poll(cons, topic)
            if r is not None:
                out(r); n += 1
        c.close(cons)
        out({"closed": n})
    elif cmd == "times":
        c.times(args[0], int(args[1]), [int(t) for t in args[2:]])
    elif cmd == "delete-group":
        c.delete_group(args[0])
    elif cmd == "metadata":
        c.metadata(args[0])
    elif cmd == "admin":
        c.admin(args[0])
    elif cmd == "inspect":
        c.inspect(args[0], args[1])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
