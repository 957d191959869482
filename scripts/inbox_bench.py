#!/usr/bin/env python3
"""The inbox benchmark of scripts/inbox_bench (issue #33, "Performance"), on Redis.

Run through `scripts/inbox_bench` (which builds examples/loadtest_server.rs in release mode);
`scripts/inbox_bench --help` lists the options. Standard library only; reuses the helpers of
scripts/loadtest.py (redis-server on a free 127.0.0.1 port, the server, wrk and its Lua script,
the 1 KiB WhatsApp-shaped body).

Three figures, each against its bound:

1. Acknowledgement: req/s of first deliveries (every key new) on `/inbox` (inbox mode on a
   `RedisInbox`: one script stores the key and the entry) against `/webhook` (the synchronous
   route on `RedisStore` with an instant handler: a claim, the handler, a completion).
   The two routes alternate in --rounds rounds (so that a burst of load from elsewhere on the
   host hits both); their medians are compared. Bound: inbox >= 1.2x sync.
2. Drain: in each round, the entries (1) queued with no worker running, then the server
   restarted with `INBOX_WORKERS` workers and timed until nothing is pending or in flight:
   entries/s against the synchronous route's first-delivery req/s of the same round (same
   handler, same Redis, the same minute of the host's noise); the median of the rounds.
   Bound: >= 0.8x.
3. Idle workers (issue #50): the commands a server with `INBOX_WORKERS` workers and nothing to
   do sends Redis, by `MONITOR` over --idle seconds (the scripts' own commands left out): per
   second, per worker process. Bound: <= 1.
4. Wake-up latency (issue #50): one idle worker; --wakes deliveries one after the other, each
   after the worker went idle again: the time from the 202 (read by this script) to the
   handler's start (`GET /inbox/started/{id}`, the same host's clock). Bound: median <= 5 ms.
5. Memory per pending entry, the first round's: `MEMORY USAGE` (exact, `SAMPLES 0`) of the
   entries' hashes and bodies (a sample of them) plus each entry's share of the inbox's sorted sets (`due`, `live`), with
   `used_memory` before and after as a cross-check. Bound: <= 2x the body + 200 bytes.

By default nothing is pinned, as in compare/run: the server (one Tokio worker), wrk (one
thread) and redis-server share the CPUs, so a route's req/s follows the CPU all three spend on
one request. `--pinning split` pins the server to one CPU and wrk and redis-server to the other,
as scripts/loadtest does: there the synchronous route is bound by the server's CPU and the
inbox by what Redis and wrk spend together, so the ratio says more about the layout than about
the routes. On a shared, noisy host one run says little: compare the two
routes of the same run (the per-round ratios show the spread), and run it again before
trusting a figure. Exits 1 when a figure misses its bound.
"""
import argparse
import collections
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loadtest import ROOT, RedisServer, Server, cpu_seconds, log, whatsapp_payload, wrk  # noqa: E402

INBOX = "{inbox:loadtest}:"


def server(binary, cpu, redis, workers, started=False):
    """The loadtest server on Redis, with `workers` inbox workers (0: receives only); with
    `started`, its handler records when it starts each entry (`GET /inbox/started/{id}`), which
    the drain is not to pay for."""
    # Server passes the environment on: INBOX_WORKERS is read by the redis variant only.
    os.environ["INBOX_WORKERS"] = str(workers)
    if started:
        os.environ["INBOX_STARTED"] = "1"
    else:
        os.environ.pop("INBOX_STARTED", None)
    return Server(binary, "redis", cpu, redis.url)


class Replica:
    """A redis-server replicating `primary`, up and in sync before it returns."""

    def __init__(self, primary, cpu):
        self.inner = RedisServer(cpu)
        self.inner.admin.cmd("REPLICAOF", "127.0.0.1", str(primary.port))
        deadline = time.time() + 30
        while b"master_link_status:up" not in self.inner.admin.cmd("INFO", "replication"):
            if time.time() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.05)
        log(f"   replica on port {self.inner.port} in sync")

    def stop(self):
        self.inner.stop()


def counts(srv):
    conn = http.client.HTTPConnection(srv.host, int(srv.port), timeout=10)
    try:
        conn.request("GET", "/inbox")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET /inbox: {response.status} {body!r}")
        return json.loads(body)
    finally:
        conn.close()


def first_deliveries(srv, redis, path, connections, duration, body_path, run, cpu):
    """wrk on `path`, every key new; req/s, the server's and Redis's CPU, the run's figures."""
    env = {"LT_BODY": body_path, "LT_PATH": path, "LT_RUN": run}
    cpu0 = (cpu_seconds(srv.pid), cpu_seconds(redis.proc.pid))
    r = wrk(f"http://{srv.addr}{path}", connections, duration, env, cpu)
    seconds = r["duration_us"] / 1e6
    r["server_cpu_pct"] = (cpu_seconds(srv.pid) - cpu0[0]) / seconds * 100
    r["redis_cpu_pct"] = (cpu_seconds(redis.proc.pid) - cpu0[1]) / seconds * 100
    r["wrk_cpu_pct"] = r["wrk_cpu_s"] / seconds * 100
    errors = sum(r[k] for k in r if k.startswith("errors_"))
    if errors:
        raise RuntimeError(f"{path}: {errors} errors (non-2xx or socket) in {r}")
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    log(f"   {path:8} c={connections}: {r['rps']:9,.0f} req/s  p50 {r['p50_us'] / 1000:.2f} ms  "
        f"p99 {r['p99_us'] / 1000:.2f} ms  ({r['requests']} requests; CPU: server "
        f"{r['server_cpu_pct']:.0f} %, redis {r['redis_cpu_pct']:.0f} %, wrk {r['wrk_cpu_pct']:.0f} %)")
    return r


def memory_per_entry(redis, pending, sample):
    """Bytes per pending entry: the mean hash and body (over `sample` of them) plus its share of
    the sets."""
    keys = redis.keys(INBOX + "e:*", limit=sample)[:sample]
    assert keys, "no inbox entry in Redis"
    # An entry is its hash of small fields and its body's string (`b:<key>`).
    def usage(key):
        return redis.admin.cmd("MEMORY", "USAGE", key, "SAMPLES", "0") or 0
    hashes = [usage(k) + usage(k.replace(b"e:", b"b:", 1) if isinstance(k, bytes)
                                else k.replace("e:", "b:", 1)) for k in keys]
    sets = {name: redis.admin.cmd("MEMORY", "USAGE", INBOX + name, "SAMPLES", "0") or 0
            for name in ("due", "live", "leased", "dead")}
    hash_mean = sum(hashes) / len(hashes)
    return {
        "hash_bytes": hash_mean,
        "sets_bytes_per_entry": sum(sets.values()) / pending,
        "per_entry": hash_mean + sum(sets.values()) / pending,
        "sampled": len(keys),
        "encoding": redis.admin.cmd("OBJECT", "ENCODING", keys[0]).decode(),
        "sets": sets,
    }


def drain(binary, cpu, redis, workers, pending, timeout):
    """Restarts the server with workers; entries/s until nothing is pending or in flight."""
    started = time.monotonic()
    redis_cpu = cpu_seconds(redis.proc.pid)
    srv = server(binary, cpu, redis, workers)
    try:
        deadline = started + timeout
        while True:
            c = counts(srv)
            if c["pending"] == 0 and c["in_flight"] == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not drained in {timeout} s: {c}")
            time.sleep(0.01)
        seconds = time.monotonic() - started
        server_cpu = cpu_seconds(srv.pid)
        redis_cpu = cpu_seconds(redis.proc.pid) - redis_cpu
        if c["dead"]:
            raise RuntimeError(f"{c['dead']} dead letters: the instant handler never fails")
    finally:
        srv.stop()
    return {"entries": pending, "seconds": seconds, "rate": pending / seconds,
            "server_cpu_pct": server_cpu / seconds * 100, "redis_cpu_pct": redis_cpu / seconds * 100}


def idle_commands(binary, cpu, redis, workers, seconds):
    """Commands per second an idle server with `workers` workers sends Redis (MONITOR's lines,
    less what scripts run inside Redis), and how many of each."""
    srv = server(binary, cpu, redis, workers)
    try:
        # Started: subscribed, its first take done.
        time.sleep(2)
        out = subprocess.run(["timeout", str(seconds), "redis-cli", "-p", str(redis.port), "monitor"],
                             capture_output=True, text=True).stdout
    finally:
        srv.stop()
    sent = collections.Counter()
    for line in out.splitlines():
        parts = line.split('"')
        if len(parts) < 2 or " lua]" in parts[0]:
            continue
        sent[parts[1].lower()] += 1
    return {"per_second": sum(sent.values()) / seconds, "seconds": seconds, "commands": dict(sent)}


def post_inbox(conn, rid, body):
    conn.request("POST", "/inbox", body, {"Idempotency-Key": rid, "X-Request-Id": rid,
                                          "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    acked = time.time()
    if response.status != 202:
        raise RuntimeError(f"POST /inbox: {response.status}")
    return acked


def started_at(conn, rid, deadline):
    while True:
        conn.request("GET", f"/inbox/started/{rid}")
        response = conn.getresponse()
        body = response.read()
        if response.status == 200:
            return int(body) / 1e6
        if time.monotonic() > deadline:
            raise RuntimeError(f"{rid} never started")
        time.sleep(0.005)


def wake_latency(binary, cpu, redis, n, run):
    """Milliseconds from each 202 to its handler's start, one idle worker, deliveries one at a
    time (each waits until the last one started and 50 ms more: the worker is idle again)."""
    srv = server(binary, cpu, redis, 1, started=True)
    try:
        time.sleep(2)
        conn = http.client.HTTPConnection(srv.host, int(srv.port), timeout=10)
        latencies = []
        for i in range(n):
            rid = f"wake-{run}-{i}"
            acked = post_inbox(conn, rid, json.dumps({"id": rid}).encode())
            latencies.append((started_at(conn, rid, time.monotonic() + 10) - acked) * 1000)
            time.sleep(0.05)
        conn.close()
    finally:
        srv.stop()
    latencies.sort()
    return {"median_ms": median(latencies), "p90_ms": latencies[int(len(latencies) * 0.9)],
            "max_ms": latencies[-1], "min_ms": latencies[0], "n": n}


def median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def verdict(ok):
    return "ok" if ok else "BELOW THE BOUND"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.path.join(ROOT, "target", "release", "examples", "loadtest_server"))
    p.add_argument("--duration", type=int, default=4, help="seconds per measured wrk run (default 4)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of the two routes, interleaved; medians are compared (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up seconds per route (default 1)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    p.add_argument("--workers", type=int, default=0,
                   help="entries the drain's Worker runs at once (default: --connections)")
    p.add_argument("--idle", type=int, default=10, help="seconds of MONITOR on idle workers (default 10)")
    p.add_argument("--wakes", type=int, default=100, help="deliveries timed from the 202 to the handler (default 100; 0: not measured, e.g. for a build without the started endpoint)")
    p.add_argument("--sample", type=int, default=2000, help="entry hashes sized with MEMORY USAGE (default 2000)")
    p.add_argument("--pinning", choices=("none", "split"), default="none",
                   help="none (default): no process pinned, as compare/run runs; split: the server on "
                        "the first CPU, wrk and redis-server on the second")
    p.add_argument("--replica", action="store_true",
                   help="give the redis-server a replica (on the same CPUs), as a deployment with "
                        "failover has")
    p.add_argument("--wait-replicas", type=int, default=0,
                   help="REDIS_WAIT_REPLICAS for the server: durable completions and inbox writes "
                        "wait for that many replicas (default 0: off; needs --replica)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    if args.wait_replicas:
        assert args.replica, "--wait-replicas needs --replica"
        os.environ["REDIS_WAIT_REPLICAS"] = str(args.wait_replicas)
        os.environ.setdefault("REDIS_WAIT_TIMEOUT_MS", "1000")
    assert 1 <= args.duration <= 120 and 1 <= args.rounds <= 20 and 0 <= args.warmup <= 30 and 1 <= args.connections <= 1024
    workers = args.workers or args.connections

    allowed = sorted(os.sched_getaffinity(0))
    split = args.pinning == "split" and len(allowed) >= 2
    server_cpu, client_cpu = (allowed[0], allowed[1]) if split else (None, None)
    body = whatsapp_payload(1024)
    tmp = tempfile.mkdtemp(prefix="inbox-bench-")
    body_path = os.path.join(tmp, "body.json")
    with open(body_path, "wb") as f:
        f.write(body)
    run = str(time.time_ns())
    redis = RedisServer(client_cpu)
    try:
        replica = Replica(redis, client_cpu) if args.replica else None
    except BaseException:
        redis.stop()
        raise
    results = {"redis_version": redis.version, "body_bytes": len(body), "connections": args.connections,
               "replica": args.replica, "wait_replicas": args.wait_replicas,
               "workers": workers, "duration": args.duration,
               "pinning": (f"server on CPU {server_cpu}; wrk and redis-server on CPU {client_cpu}" if split
                           else f"nothing pinned, {len(allowed)} CPUs")}
    try:
        srv = server(args.server, server_cpu, redis, 0)
        try:
            if args.warmup:
                log(f"== warm-up, {args.warmup} s per route")
                for path in ("/webhook", "/inbox"):
                    first_deliveries(srv, redis, path, args.connections, args.warmup, body_path, f"{run}-warm", client_cpu)
                warmed = counts(srv)["pending"]
                srv.stop()
                # What the warm-up queued is drained before the rounds, not counted.
                drain(args.server, server_cpu, redis, workers, warmed, 600)
                srv = server(args.server, server_cpu, redis, 0)
            syncs, inboxes, drains = [], [], []
            for rnd in range(args.rounds):
                log(f"== round {rnd + 1}/{args.rounds}: first deliveries, {args.duration} s per route, then the drain")
                syncs.append(first_deliveries(srv, redis, "/webhook", args.connections, args.duration,
                                              body_path, f"{run}-sync-{rnd}", client_cpu))
                used_before = redis.used_memory()
                inbox = first_deliveries(srv, redis, "/inbox", args.connections, args.duration, body_path,
                                         f"{run}-inbox-{rnd}", client_cpu)
                inboxes.append(inbox)
                stored = counts(srv)["pending"]
                # wrk counts the answers it read: the requests in flight when it stopped were
                # stored too.
                acked = inbox["requests"]
                assert acked <= stored <= acked + args.connections, f"{acked} acknowledged, {stored} stored"
                if rnd == 0:
                    log(f"== memory of {stored} pending entries")
                    memory = memory_per_entry(redis, stored, args.sample)
                    memory["used_memory_delta_per_entry"] = (redis.used_memory() - used_before) / stored
                    memory["bound"] = 2 * len(body) + 200
                    results["memory"] = memory
                srv.stop()
                drained = drain(args.server, server_cpu, redis, workers, stored, timeout=600)
                drained["ratio"] = drained["rate"] / syncs[-1]["rps"]
                log(f"   drain: {stored} entries in {drained['seconds']:.2f} s = {drained['rate']:,.0f} entries/s "
                    f"(CPU: server {drained['server_cpu_pct']:.0f} %, redis {drained['redis_cpu_pct']:.0f} %): "
                    f"{drained['ratio']:.2f}x this round's sync req/s")
                drains.append(drained)
                srv = server(args.server, server_cpu, redis, 0)
        finally:
            srv.stop()
        sync_rps = median([r["rps"] for r in syncs])
        inbox_rps = median([r["rps"] for r in inboxes])
        results["ack"] = {"sync_rps": sync_rps, "inbox_rps": inbox_rps, "ratio": inbox_rps / sync_rps,
                          "rounds": [{"sync_rps": a["rps"], "inbox_rps": b["rps"]} for a, b in zip(syncs, inboxes)]}
        results["drain"] = {"ratio": median([d["ratio"] for d in drains]),
                            "rate": median([d["rate"] for d in drains]), "rounds": drains}
        log(f"== idle: {args.idle} s of MONITOR on a server with {workers} workers and nothing to do")
        results["idle"] = idle_commands(args.server, server_cpu, redis, workers, args.idle)
        if args.wakes > 0:
            log(f"== wake-up: {args.wakes} deliveries to one idle worker")
            results["wake"] = wake_latency(args.server, server_cpu, redis, args.wakes, run)
    finally:
        if replica:
            replica.stop()
        redis.stop()

    ack, mem, dr = results["ack"], results["memory"], results["drain"]
    print(f"Redis {results['redis_version']}, body {len(body)} B, wrk -t1 -c{args.connections}, "
          f"{args.rounds} rounds of {args.duration} s per route ({results['pinning']})")
    rounds = ", ".join(f"{r['inbox_rps'] / r['sync_rps']:.2f}x" for r in ack["rounds"])
    print(f"acknowledge first deliveries (medians; rounds {rounds}): sync /webhook {ack['sync_rps']:,.0f} req/s, inbox /inbox "
          f"{ack['inbox_rps']:,.0f} req/s: {ack['ratio']:.2f}x (bound >= 1.2x: {verdict(ack['ratio'] >= 1.2)})")
    rounds = ", ".join(f"{d['ratio']:.2f}x" for d in dr["rounds"])
    print(f"drain ({workers} workers, each round's entries after it; median of rounds {rounds}): "
          f"{dr['rate']:,.0f} entries/s: {dr['ratio']:.2f}x the sync route's req/s of the same round "
          f"(bound >= 0.8x: {verdict(dr['ratio'] >= 0.8)})")
    # CPU per request moves less with the host's other work than req/s: what the processes spent.
    def cpu_us(r, rate, parts):
        return sum(r[f"{part}_cpu_pct"] for part in parts) / 100 / rate * 1e6
    sync_cpu = median([cpu_us(r, r["rps"], ("server", "redis", "wrk")) for r in syncs])
    inbox_cpu = median([cpu_us(r, r["rps"], ("server", "redis", "wrk")) for r in inboxes])
    sync_cpu_sr = median([cpu_us(r, r["rps"], ("server", "redis")) for r in syncs])
    drain_cpu = median([cpu_us(d, d["rate"], ("server", "redis")) for d in drains])
    results["cpu_us"] = {"sync": sync_cpu, "inbox": inbox_cpu, "sync_server_redis": sync_cpu_sr,
                         "drain": drain_cpu}
    print(f"CPU per request, medians (not a bound): sync {sync_cpu:.1f} us, inbox {inbox_cpu:.1f} us "
          f"(server + Redis + wrk; sync/inbox {sync_cpu / inbox_cpu:.2f}x); drain {drain_cpu:.1f} us "
          f"per entry against sync {sync_cpu_sr:.1f} us (server + Redis; {sync_cpu_sr / drain_cpu:.2f}x)")
    print(f"memory per pending entry: {mem['per_entry']:.0f} B = hash and body {mem['hash_bytes']:.0f} B "
          f"({mem['encoding']}, {mem['sampled']} sampled) + sorted sets {mem['sets_bytes_per_entry']:.0f} B; "
          f"used_memory delta {mem['used_memory_delta_per_entry']:.0f} B/entry; bound 2 x {len(body)} + 200 = "
          f"{mem['bound']} B: {verdict(mem['per_entry'] <= mem['bound'])}")
    idle, wake = results["idle"], results.get("wake")
    print(f"idle workers: {idle['per_second']:.2f} commands/s per worker process over {idle['seconds']} s "
          f"({', '.join(f'{n} {c}' for c, n in sorted(idle['commands'].items())) or 'none'}; "
          f"bound <= 1: {verdict(idle['per_second'] <= 1)})")
    if wake:
        print(f"wake-up, 202 to the handler's start, one idle worker, {wake['n']} deliveries: median "
              f"{wake['median_ms']:.2f} ms, p90 {wake['p90_ms']:.2f} ms, max {wake['max_ms']:.2f} ms "
              f"(bound median <= 5 ms: {verdict(wake['median_ms'] <= 5)})")
    else:
        print("wake-up: not measured (--wakes 0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    ok = (ack["ratio"] >= 1.2 and dr["ratio"] >= 0.8 and mem["per_entry"] <= mem["bound"]
          and idle["per_second"] <= 1 and (wake is None or wake["median_ms"] <= 5))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
