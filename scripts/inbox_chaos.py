#!/usr/bin/env python3
"""The inbox's at-least-once chaos run of scripts/inbox_chaos, on real processes.

Run through `scripts/inbox_chaos` (which builds the examples webhook_receiver and
inbox_worker); `scripts/inbox_chaos --help` lists the options. Standard library only.

On 127.0.0.1 and free ports, in a temporary directory:

- Redis, one of `--redis`:
  - standalone: one redis-server (`--appendonly yes --appendfsync always`), killed -9
    mid-run and started again on the same port and directory;
  - sentinel: a primary, a replica and three sentinels (quorum 2, down-after 1000 ms,
    failover-timeout 3000 ms); the primary killed -9 mid-run, the failover waited for, then
    the old primary started again (the sentinels make it a replica);
  - cluster: 3 primaries + 3 replicas (cluster-node-timeout 1000 ms); the primary owning
    the slot of the hash tag `inbox:inbox_email` killed -9 mid-run, the failover waited
    for, then the node started again (it rejoins as a replica).
- two receivers (`webhook_receiver`, `INBOX_WORKERS=0`) and two `inbox_worker`s
  (`INBOX_WORKERS=4`, lease 2 s, retry base 100 ms), with `REDIS_WAIT_REPLICAS`
  (`--wait-replicas`, default 1 on sentinel and cluster, unset on standalone); one worker is
  killed -9 and started again mid-run (`--worker-kill-at 0` turns that off).
- the sender: `--messages` messages x 5 email events (sent, delivered, opened, clicked,
  complained; `occurred_at` increasing in that order), shuffled, paced at `--rate` events/s,
  `--threads` threads, each POSTed to `/inbox/email` of a random receiver and retried (with
  a backoff, on the other receiver) until it gets a 2xx (202 queued, 200 replayed); about
  `--fail-pct` % carry `demo_fail_attempts: 1`, about `--abandon-pct` % of first attempts
  are abandoned (sent, then the connection closed within `--abandon-ms` without reading the
  answer), as a provider's time-out would, and retried.
- a sampler reading `GET /messages/m_X` of a few messages every 200 ms: a status going back
  (sent < delivered < opened < clicked < complained) is "out of order".
- then waits until `GET /inbox` shows nothing pending or in flight and the effects stop
  changing, and reads `GET /effects` and `GET /messages/m_X`.

Lost: an acknowledged message whose final status is not its newest event's (`complained`),
plus newest events applied 0 times. An older event applied 0 times is legitimately stale (a
newer event of its message was applied before it) and counted as `stale`. Doubled: events
applied more than once. Dead: the inbox's dead letters. Prints one summary line
(`redis=.. events=.. acked=.. lost=.. doubled=.. out_of_order=.. dead=.. ..`) and exits 1
when lost, doubled, out_of_order or dead is not 0, or when not every event was acknowledged
or the inbox did not drain before `--deadline`. The temporary directory (logs of every
process) is kept on failure or with `--keep`.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TYPES = ("sent", "delivered", "opened", "clicked", "complained")
RANK = {t: i for i, t in enumerate(TYPES)}
SERVICE = "mymaster"
HASH_TAG = "inbox:inbox_email"
T0 = time.monotonic()


def log(*args):
    print(f"[{time.monotonic() - T0:7.2f}s]", *args, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_cli(port, *args, timeout=3):
    """A command's reply as text (redis-cli --raw), or None when the node does not answer."""
    try:
        out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--raw", *args],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return out.stdout


def info_field(port, section, field):
    text = redis_cli(port, "INFO", section)
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


def cluster_state(port):
    for line in (redis_cli(port, "CLUSTER", "INFO", timeout=2) or "").splitlines():
        if line.startswith("cluster_state:"):
            return line.split(":", 1)[1].strip()
    return None


def wait_until(timeout, what, check, every=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Exception as e:  # noqa: BLE001: reported when the time is up
            result, last = None, repr(e)
        if result:
            return result
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what} (last error: {last})")


# ---------------------------------------------------------------- processes

PROCESSES = []


class Proc:
    """A child process, its stdout and stderr in files; killed -9 and started again with the
    same arguments and environment."""

    def __init__(self, name, argv, tmp, env=None, ready=None, port=None):
        self.name, self.argv, self.env, self.ready, self.port = name, argv, env, ready, port
        self.out_path = os.path.join(tmp, f"{name}.out")
        self.err_path = os.path.join(tmp, f"{name}.err")
        self.proc = None
        self.starts = 0
        self.line = None
        PROCESSES.append(self)
        self.start()

    def start(self):
        self.starts += 1
        out = open(self.out_path, "ab")
        err = open(self.err_path, "ab")
        marker = f"--- start {self.starts} at {time.monotonic() - T0:.2f}s ---\n".encode()
        out.write(marker)
        err.write(marker)
        out.flush()
        err.flush()
        offset = out.tell()
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True, cwd=ROOT)
        out.close()
        err.close()
        if self.ready:
            self.line = wait_until(60, f"{self.name} to print {self.ready!r}",
                                   lambda: self._line(offset), every=0.05)
        elif self.port:
            wait_until(30, f"{self.name} to answer PING",
                       lambda: (redis_cli(self.port, "PING", timeout=1) or "").strip() == "PONG")

    def _line(self, offset):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.err_path}")
        with open(self.out_path, "rb") as f:
            f.seek(offset)
            for line in f.read().decode(errors="replace").splitlines():
                if line.startswith(self.ready):
                    return line
        return None

    @property
    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.running():
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if not self.running():
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cleanup():
    for p in reversed(PROCESSES):
        try:
            p.kill9() if p.name.startswith("redis") or p.name.startswith("sentinel") else p.stop()
        except Exception:  # noqa: BLE001
            pass


def redis_node(name, tmp, extra, port=None):
    port = port or free_port()
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "no",
            "--dir", d, "--logfile", os.path.join(d, "redis.log"), "--save", "",
            "--repl-diskless-sync-delay", "0", *extra]
    return Proc(name, argv, tmp, port=port)


# ---------------------------------------------------------------- deployments


def fail_over(events, node, what, failed_over):
    """Kills the primary `node` (-9) and waits (60 s at most) until `failed_over()` names the
    new primary, which it returns; both steps are added to `events`."""
    node.kill9()
    events.append(("primary killed", time.monotonic()))
    new = wait_until(60, what, failed_over, every=0.1)
    events.append(("failover done", time.monotonic()))
    return new


def rejoin(events, node, replicating):
    """Starts the old primary `node` again and waits (30 s at most) until it replicates, then
    logs `replicating`; both steps are added to `events`. Not replicating in time is logged,
    not raised."""
    node.start()
    events.append(("old primary restarted", time.monotonic()))
    try:
        wait_until(30, "the old primary to replicate", lambda: info_field(
            node.port, "replication", "master_link_status") == "up", every=0.2)
        events.append(("old primary replicating", time.monotonic()))
        log(f"fault: {replicating}")
    except RuntimeError as e:
        log(f"fault: {e}")


class Standalone:
    def __init__(self, tmp, down=3.0, aof="always"):
        self.down, self.aof = down, aof
        persistence = ["--appendonly", "no"] if aof == "off" else ["--appendonly", "yes", "--appendfsync", aof]
        self.node = redis_node("redis", tmp, persistence)
        self.url = f"redis://127.0.0.1:{self.node.port}"

    def fault(self, events):
        log(f"fault: kill -9 redis-server :{self.node.port} (pid {self.node.pid})")
        self.node.kill9()
        events.append(("redis killed", time.monotonic()))
        time.sleep(self.down)
        self.node.start()
        events.append(("redis restarted", time.monotonic()))
        log(f"fault: redis-server :{self.node.port} restarted")

    def describe(self):
        if self.aof == "off":
            return f"standalone :{self.node.port} (no persistence: a negative control)"
        return f"standalone :{self.node.port} (AOF, appendfsync {self.aof})"


class Sentinel:
    def __init__(self, tmp):
        self.data = [redis_node("redis-primary", tmp, [])]
        primary = self.data[0].port
        self.data.append(redis_node("redis-replica", tmp, ["--replicaof", "127.0.0.1", str(primary)]))
        wait_until(30, "the replica's link", lambda: info_field(self.data[1].port, "replication",
                                                              "master_link_status") == "up")
        self.sentinels = []
        for i in range(3):
            port = free_port()
            d = os.path.join(tmp, f"sentinel{i}")
            os.makedirs(d, exist_ok=True)
            conf = os.path.join(d, "sentinel.conf")
            with open(conf, "w") as f:
                f.write(f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {d}\n"
                        f"logfile {os.path.join(d, 'sentinel.log')}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n"
                        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                        f"sentinel failover-timeout {SERVICE} 3000\n"
                        f"sentinel parallel-syncs {SERVICE} 1\n")
            self.sentinels.append(Proc(f"sentinel{i}", ["redis-server", conf, "--sentinel"], tmp, port=port))
        wait_until(30, "the sentinels to know each other and the replica", self._settled, every=0.2)
        s = self.sentinels
        self.url = (f"redis-sentinel://127.0.0.1:{s[0].port}?node=127.0.0.1:{s[1].port}"
                    f"&node=127.0.0.1:{s[2].port}&sentinelServiceName={SERVICE}")

    def _settled(self):
        for s in self.sentinels:
            text = redis_cli(s.port, "SENTINEL", "MASTER", SERVICE)
            if not text:
                return False
            lines = text.splitlines()
            fields = dict(zip(lines[0::2], lines[1::2]))
            if int(fields.get("num-other-sentinels", 0)) < 2 or int(fields.get("num-slaves", 0)) < 1:
                return False
        return True

    def master_port(self, sentinel):
        text = redis_cli(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        lines = (text or "").split()
        return int(lines[1]) if len(lines) == 2 else None

    def fault(self, events):
        old = self.master_port(self.sentinels[0])
        node = next(n for n in self.data if n.port == old)
        log(f"fault: kill -9 the primary :{old} (pid {node.pid})")

        def failed_over():
            named = {self.master_port(s) for s in self.sentinels}
            if len(named) != 1 or old in named or None in named:
                return None
            port = named.pop()
            return port if info_field(port, "replication", "role") == "master" else None
        new = fail_over(events, node, "the sentinel failover", failed_over)
        log(f"fault: failover to :{new}; starting :{old} again")
        rejoin(events, node, f":{old} replicates :{new}")

    def describe(self):
        return (f"sentinel: data :{self.data[0].port} (primary) :{self.data[1].port}, sentinels "
                + " ".join(f":{s.port}" for s in self.sentinels))


class Cluster:
    def __init__(self, tmp):
        self.nodes = []
        for i in range(6):
            bus = free_port()
            d = os.path.join(tmp, f"redis-node{i}")
            self.nodes.append(redis_node(f"redis-node{i}", tmp, [
                "--cluster-enabled", "yes", "--cluster-config-file", os.path.join(d, "nodes.conf"),
                "--cluster-port", str(bus), "--cluster-node-timeout", "1000",
                "--cluster-replica-validity-factor", "0", "--appendonly", "no"]))
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        out = subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "1",
                              "--cluster-yes"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
        wait_until(60, "a healthy cluster", self._healthy, every=0.2)
        self.slot = int(redis_cli(self.nodes[0].port, "CLUSTER", "KEYSLOT", HASH_TAG).strip())
        self.url = (f"redis-cluster://{addrs[0]}?" + "&".join(f"node={a}" for a in addrs[1:]))

    def _nodes(self, port):
        """CLUSTER NODES from `port`: [(port, flags, master_id, id, slots)]."""
        text = redis_cli(port, "CLUSTER", "NODES", timeout=2)
        rows = []
        for line in (text or "").splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            p = int(parts[1].split("@")[0].rsplit(":", 1)[1] or 0)
            rows.append((p, parts[2].split(","), parts[3], parts[0], parts[8:]))
        return rows

    def owner(self, port):
        for p, flags, _, _, slots in self._nodes(port):
            if "master" not in flags or "fail" in flags:
                continue
            for s in slots:
                if s.startswith("["):
                    continue
                lo, _, hi = s.partition("-")
                if int(lo) <= self.slot <= int(hi or lo):
                    return p
        return None

    def _healthy(self):
        for n in self.nodes:
            if cluster_state(n.port) != "ok":
                return False
            rows = self._nodes(n.port)
            if len(rows) != 6 or any("fail" in f or "fail?" in f for _, f, _, _, _ in rows):
                return False
            if info_field(n.port, "replication", "role") == "slave" and info_field(
                    n.port, "replication", "master_link_status") != "up":
                return False
        return True

    def fault(self, events):
        old = self.owner(self.nodes[0].port)
        node = next(n for n in self.nodes if n.port == old)
        log(f"fault: kill -9 the primary :{old} (pid {node.pid}) of slot {self.slot} ({HASH_TAG})")
        others = [n for n in self.nodes if n is not node]

        def failed_over():
            owners = {self.owner(n.port) for n in others}
            if len(owners) != 1 or old in owners or None in owners:
                return None
            new = owners.pop()
            if all(cluster_state(n.port) == "ok" for n in others):
                return new
            return None
        new = fail_over(events, node, "the cluster failover", failed_over)
        log(f"fault: slot {self.slot} failed over to :{new}; starting :{old} again")
        rejoin(events, node, f":{old} replicates again")

    def describe(self):
        return f"cluster: " + " ".join(f":{n.port}" for n in self.nodes) + f"; slot {self.slot}"


# ---------------------------------------------------------------- HTTP


class Abandoned(Exception):
    """The sender closed the connection without reading the answer."""


def call(addr, method, path, body=None, timeout=5.0, headers=None, abandon_after=None):
    """(status, headers, body); with `abandon_after` (seconds), the request is sent and the
    connection closed that long after, unread, as a provider timing out would: `Abandoned`."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body, headers or {})
        if abandon_after is not None:
            time.sleep(abandon_after)
            raise Abandoned()
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()



def get_json(addr, path, timeout=5.0):
    status, _, data = call(addr, "GET", path, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {data[:200]!r}")
    return json.loads(data)


# ---------------------------------------------------------------- the run


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked = 0
        self.posts = 0
        self.codes = {}
        self.errors = {}
        self.abandoned = 0
        self.replayed = 0
        self.rejected = []


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis", choices=("standalone", "sentinel", "cluster"), default="standalone")
    p.add_argument("--messages", type=int, default=200, help="messages, 5 events each (default 200)")
    p.add_argument("--threads", type=int, default=16, help="sender threads (default 16)")
    p.add_argument("--rate", type=float, default=100, help="events started per second (default 100)")
    p.add_argument("--fail-pct", type=float, default=5, help="%% of events with demo_fail_attempts 1 (5)")
    p.add_argument("--abandon-pct", type=float, default=3,
                   help="%% of first attempts abandoned: sent, then the connection closed unread (3)")
    p.add_argument("--abandon-ms", type=float, default=3,
                   help="an abandoned attempt closes its connection up to this many ms after sending (3)")
    p.add_argument("--aof", choices=("always", "everysec", "no", "off"), default="always",
                   help="standalone: appendfsync (always); off: no persistence at all, so the kill "
                        "loses what was acknowledged (a negative control: the run must fail)")
    p.add_argument("--down", type=float, default=3,
                   help="standalone: seconds the killed redis-server stays down (3)")
    p.add_argument("--delay-ms", type=int, default=0,
                   help="each event's handler sleeps 0..N ms (demo_delay_ms), so that entries are in "
                        "flight and queued when Redis and the worker are killed (default 0)")
    p.add_argument("--wait-replicas", type=int, default=None,
                   help="REDIS_WAIT_REPLICAS (default 1 on sentinel and cluster; 0: unset)")
    p.add_argument("--wait-timeout-ms", type=int, default=500, help="REDIS_WAIT_TIMEOUT_MS (500)")
    p.add_argument("--fault-at", type=float, default=0.3,
                   help="the Redis fault once this share of events is acknowledged (0.3; 0: none)")
    p.add_argument("--worker-kill-at", type=float, default=0.5,
                   help="kill -9 a worker (and start it again) at this share acknowledged (0.5; 0: none)")
    p.add_argument("--deadline", type=float, default=180, help="seconds for sending and draining (180)")
    p.add_argument("--settle", type=float, default=3, help="seconds with nothing changing to call it drained (3)")
    p.add_argument("--samples", type=int, default=10, help="messages sampled every 200 ms (10)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "debug", "examples"))
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    wait_replicas = args.wait_replicas
    if wait_replicas is None:
        wait_replicas = 0 if args.redis == "standalone" else 1
    receiver_bin = os.path.join(args.bin_dir, "webhook_receiver")
    worker_bin = os.path.join(args.bin_dir, "inbox_worker")
    for b in (receiver_bin, worker_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} missing: cargo build --all-features --example webhook_receiver --example inbox_worker")

    tmp = tempfile.mkdtemp(prefix=f"inbox-chaos-{args.redis}-")
    log(f"temporary directory {tmp}; seed {seed}")
    ok = False

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    try:
        ok = run(args, rng, seed, wait_replicas, receiver_bin, worker_bin, tmp)
    except KeyboardInterrupt as e:
        log(f"interrupted ({e})")
    except Exception as e:  # noqa: BLE001
        log(f"error: {e!r}")
    finally:
        cleanup()
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    return 0 if ok else 1


def run(args, rng, seed, wait_replicas, receiver_bin, worker_bin, tmp):
    deployment = (Standalone(tmp, args.down, args.aof) if args.redis == "standalone"
                  else {"sentinel": Sentinel, "cluster": Cluster}[args.redis](tmp))
    log(f"redis: {deployment.describe()}; url {deployment.url}")
    env = {"REDIS_URL": deployment.url, "REDIS_WAIT_TIMEOUT_MS": str(args.wait_timeout_ms),
           "RUST_LOG": os.environ.get("RUST_LOG", "info")}
    if wait_replicas:
        env["REDIS_WAIT_REPLICAS"] = str(wait_replicas)
    receivers = [Proc(f"receiver{i}", [receiver_bin], tmp, ready="listening on http://",
                      env=dict(env, BIND="127.0.0.1:0", INBOX_WORKERS="0")) for i in range(2)]
    addrs = [r.line.split("http://", 1)[1].strip() for r in receivers]
    workers = [Proc(f"worker{i}", [worker_bin], tmp, ready="worker ready",
                    env=dict(env, INBOX_WORKERS="4", INBOX_LEASE_MS="2000", INBOX_RETRY_BASE_MS="100"))
               for i in range(2)]
    log(f"receivers {addrs}; workers pids {[w.pid for w in workers]}")

    # The events, shuffled.
    base = 1796126400  # 2026-12-01T10:00:00Z
    events = []
    for m in range(args.messages):
        for k, t in enumerate(TYPES):
            body = {"event_id": f"ev_{m}_{k}", "message_id": f"m_{m}", "type": f"email.{t}",
                    "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base + m + 60 * k))}
            if rng.random() * 100 < args.fail_pct:
                body["demo_fail_attempts"] = 1
            if args.delay_ms:
                body["demo_delay_ms"] = rng.randrange(args.delay_ms + 1)
            events.append(body)
    rng.shuffle(events)
    n = len(events)
    failing = sum(1 for e in events if "demo_fail_attempts" in e)
    stats = Stats()
    timeline = []
    start = time.monotonic()
    deadline = start + args.deadline
    stop = threading.Event()
    cursor = iter(range(n))
    cursor_lock = threading.Lock()
    acked_at = {}
    first_sent = {}

    def send(i):
        ev = events[i]
        body = json.dumps(ev).encode()
        target = rng.randrange(2)
        attempt = 0
        first_sent[ev["event_id"]] = time.monotonic()
        while time.monotonic() < deadline and not stop.is_set():
            abandon = None
            if attempt == 0 and rng.random() * 100 < args.abandon_pct:
                abandon = rng.random() * args.abandon_ms / 1000
            attempt += 1
            with stats.lock:
                stats.posts += 1
            try:
                status, headers, data = call(addrs[target], "POST", "/inbox/email", body, timeout=5.0,
                                             headers={"Content-Type": "application/json",
                                                      "X-Request-Id": f"{ev['event_id']}-{attempt}"},
                                             abandon_after=abandon)
            except (OSError, http.client.HTTPException, Abandoned) as e:
                kind = "abandoned" if isinstance(e, Abandoned) else type(e).__name__
                with stats.lock:
                    stats.errors[kind] = stats.errors.get(kind, 0) + 1
                    if kind == "abandoned":
                        stats.abandoned += 1
                status = None
            if status is not None:
                with stats.lock:
                    stats.codes[status] = stats.codes.get(status, 0) + 1
                if 200 <= status < 300:
                    with stats.lock:
                        stats.acked += 1
                        if headers.get("idempotent-replayed") == "true":
                            stats.replayed += 1
                    acked_at[ev["event_id"]] = time.monotonic()
                    return
                if status not in (408, 409, 425, 429) and status < 500:
                    with stats.lock:
                        stats.rejected.append((ev["event_id"], status, data[:200]))
                    return
            # A backoff, then the other receiver.
            time.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)) * (0.5 + rng.random()))
            target = 1 - target

    def sender():
        while not stop.is_set():
            with cursor_lock:
                i = next(cursor, None)
            if i is None:
                return
            wait = start + i / args.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            send(i)

    samples = {f"m_{m}": [] for m in rng.sample(range(args.messages), min(args.samples, args.messages))}
    regressions = []

    def sampler():
        while not stop.is_set():
            for mid, seq in samples.items():
                try:
                    status, _, data = call(rng.choice(addrs), "GET", f"/messages/{mid}", timeout=1.0)
                except (OSError, http.client.HTTPException):
                    continue
                if status != 200:
                    continue
                s = json.loads(data).get("status")
                if not seq or seq[-1][0] != s:
                    at = time.monotonic() - start
                    if seq and RANK.get(s, -1) < RANK.get(seq[-1][0], -1):
                        regressions.append((mid, seq[-1][0], s, at))
                        log(f"OUT OF ORDER: {mid} {seq[-1][0]} -> {s} at {at:.2f}s")
                    seq.append((s, at))
            stop.wait(0.2)

    def faults():
        plan = []
        if args.fault_at > 0:
            plan.append((args.fault_at, "redis"))
        if args.worker_kill_at > 0:
            plan.append((args.worker_kill_at, "worker"))
        for share, what in sorted(plan):
            while stats.acked < share * n:
                if stop.wait(0.05):
                    return
            try:
                c = get_json(addrs[0], "/inbox", timeout=1)
                inbox = f", inbox pending {c.get('pending')} in flight {c.get('in_flight')}"
            except Exception:  # noqa: BLE001
                inbox = ""
            timeline.append((f"{what} fault at {stats.acked} acked{inbox}", time.monotonic()))
            try:
                if what == "redis":
                    deployment.fault(timeline)
                else:
                    w = workers[0]
                    log(f"fault: kill -9 worker0 (pid {w.pid})")
                    w.kill9()
                    timeline.append(("worker0 killed", time.monotonic()))
                    time.sleep(0.5)
                    w.start()
                    timeline.append(("worker0 restarted", time.monotonic()))
                    log(f"fault: worker0 restarted (pid {w.pid})")
            except Exception as e:  # noqa: BLE001
                log(f"fault {what} failed: {e!r}")
                timeline.append((f"fault {what} FAILED: {e!r}", time.monotonic()))

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(args.threads)]
    side = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=faults, daemon=True)]
    for t in threads + side:
        t.start()
    last_report = 0
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if time.monotonic() - last_report > 5:
            last_report = time.monotonic()
            log(f"sent: {stats.acked}/{n} acked, {stats.posts} posts, codes {stats.codes}, errors {stats.errors}")
    sent_s = time.monotonic() - start
    log(f"sending done in {sent_s:.1f}s: {stats.acked}/{n} acked")
    side[1].join(max(0.0, deadline - time.monotonic()))  # the faults finish (failover, restart)

    # Drained: nothing pending or in flight, the effects unchanged for --settle seconds.
    drained, counts, last, stable_since = False, {}, None, None
    while time.monotonic() < deadline:
        try:
            counts = get_json(addrs[0], "/inbox", timeout=2)
            total = get_json(addrs[0], "/effects", timeout=5)["total"]
        except Exception as e:  # noqa: BLE001
            log(f"drain: {e!r}")
            time.sleep(0.5)
            continue
        now = (counts.get("pending"), counts.get("in_flight"), counts.get("dead"), total)
        if counts.get("pending") == 0 and counts.get("in_flight") == 0 and now == last:
            if stable_since and time.monotonic() - stable_since >= args.settle:
                drained = True
                break
            stable_since = stable_since or time.monotonic()
        else:
            stable_since = None
        if now != last:
            log(f"drain: inbox {counts}, effects total {total}")
        last = now
        time.sleep(0.5)
    drain_s = time.monotonic() - start
    stop.set()
    side[0].join(2)

    effects = get_json(addrs[0], "/effects", timeout=10)
    by_key = effects.get("by_key", {})
    final = {}
    for m in range(args.messages):
        status, _, data = call(addrs[m % 2], "GET", f"/messages/m_{m}", timeout=5)
        final[f"m_{m}"] = json.loads(data).get("status") if status == 200 else None
    try:
        dead_letters = get_json(addrs[0], "/inbox/dead", timeout=5)
    except Exception as e:  # noqa: BLE001
        dead_letters = [repr(e)]

    newest = TYPES[-1]
    acked_ids = set(acked_at)
    lost_msgs = sorted(m for m, s in final.items()
                       if s != newest and f"ev_{m[2:]}_{len(TYPES) - 1}" in acked_ids)
    lost_newest = sorted(e for e in acked_ids if e.endswith(f"_{len(TYPES) - 1}") and by_key.get(e, 0) == 0)
    lost = sorted(set(lost_msgs) | {"m_" + e.split("_")[1] for e in lost_newest})
    doubled = sorted(e for e, c in by_key.items() if c > 1)
    stale = sorted(e for e in acked_ids if by_key.get(e, 0) == 0 and not e.endswith(f"_{len(TYPES) - 1}"))
    # Never applied although acknowledged before any newer event of its message was even sent:
    # nothing newer could have been applied before it, so it was not stale but skipped.
    skipped = []
    for e in stale:
        _, m, k = e.split("_")
        newer = [first_sent.get(f"ev_{m}_{j}") for j in range(int(k) + 1, len(TYPES))]
        if all(t is not None and acked_at[e] < t for t in newer):
            skipped.append(e)
    unknown = sorted(e for e in by_key if e not in acked_ids)
    hist = {}
    for s in final.values():
        hist[s] = hist.get(s, 0) + 1
    dead = counts.get("dead", len(dead_letters) if isinstance(dead_letters, list) else -1)

    print(f"== inbox chaos, redis={args.redis}: {deployment.describe()}")
    print(f"seed {seed}; {n} events ({args.messages} messages x {len(TYPES)}), {failing} with "
          f"demo_fail_attempts 1, handler delay 0..{args.delay_ms} ms; {args.threads} threads at {args.rate:g}/s; wait replicas {wait_replicas}, "
          f"timeout {args.wait_timeout_ms} ms; temp {tmp}")
    print("timeline: " + "; ".join(f"{what} {at - start:.2f}s" for what, at in timeline))
    print(f"sending: {sent_s:.1f}s, {stats.posts} POSTs, answers {dict(sorted(stats.codes.items()))}, "
          f"errors {stats.errors}, replayed {stats.replayed}, rejected {len(stats.rejected)}")
    print(f"drain: {'done' if drained else 'NOT DRAINED'} at {drain_s:.1f}s, inbox {counts}")
    print(f"effects: total {effects.get('total')}, {len(by_key)} event ids, {len(stale)} acked events never applied "
          f"(stale: a newer event of the message came first), {len(unknown)} ids not acked")
    print(f"final statuses: {dict(sorted(hist.items(), key=lambda kv: RANK.get(kv[0], -1)))}")
    print("sampled: " + "; ".join(f"{m} " + ">".join(s for s, _ in seq) for m, seq in samples.items()))
    if stats.rejected:
        print(f"rejected (non-retryable answers): {stats.rejected[:5]}")
    if lost:
        print(f"LOST ({len(lost)}): " + ", ".join(
            f"{m} final {final[m]} applied "
            + ",".join(str(by_key.get(f'ev_{m[2:]}_{k}', 0)) for k in range(len(TYPES))) for m in lost[:20]))
    if skipped:
        print(f"SKIPPED ({len(skipped)}, acked before any newer event of the message was sent, never "
              f"applied): " + ", ".join(f"{e} (acked {acked_at[e] - start:.2f}s)" for e in skipped[:20]))
    if doubled:
        print(f"DOUBLED ({len(doubled)}): " + ", ".join(f"{e}x{by_key[e]}" for e in doubled[:20]))
    if regressions:
        print(f"OUT OF ORDER ({len(regressions)}): " + ", ".join(
            f"{m} {a}->{b} at {t:.2f}s" for m, a, b, t in regressions[:20]))
    if dead:
        print(f"DEAD LETTERS: {json.dumps(dead_letters)[:2000]}")
    print(f"redis={args.redis} events={n} acked={stats.acked} lost={len(lost)} doubled={len(doubled)} "
          f"out_of_order={len(regressions)} dead={dead} deliveries={stats.posts} applied={effects.get('total')} "
          f"stale={len(stale)} skipped={len(skipped)} replayed={stats.replayed} abandoned={stats.abandoned} "
          f"drained={'yes' if drained else 'no'} seed={seed}")
    return (not lost and not skipped and not doubled and not regressions and not dead and drained and stats.acked == n)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        cleanup()
