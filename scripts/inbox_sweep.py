#!/usr/bin/env python3
"""The backlog sweep of `scripts/inbox_bench --sweep` (issue 55): how fast the inbox drains a
backlog, and what each drained entry costs, as the backlog grows, per backend.

For each backend and each size N: a fresh store (Redis `FLUSHALL`; a new PostgreSQL database;
a new SQLite file; a new memory inbox), then `examples/inbox_drain` queues N entries with 1 KiB
bodies (64 at once, not timed), waits, and on this script's signal runs the crate's `Worker`
with a no-op handler (`--workers`, 32) until nothing is pending or in flight. Printed per size:
entries/s, and the CPU per entry of the draining process (its own utime + stime over the
drain) and of the store's server (redis-server's; PostgreSQL's postmaster and all its
backends; none for memory and SQLite, which run in the process), read from /proc before the
signal and after the drain. On Redis also the commands Redis ran per entry (`INFO
commandstats`, Lua's included); with `--pg-statements`, PostgreSQL's statements by total time
(`pg_stat_statements`). Goal (issue 55): flat, the rate and the CPU per entry within 1.5x from
the smallest backlog to the largest.

The PostgreSQL server is a throw-away cluster (fsync off, as bench/queues runs it; as root, as
the `postgres` user); each backlog is `ANALYZE`d before its drain, as autovacuum would have
done after that many inserts. Standard library only.
"""
import argparse
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loadtest import CLK_TCK, ROOT, RedisServer, cpu_seconds, free_port, log  # noqa: E402

BACKENDS = ("memory", "redis", "postgres", "sqlite")


def tree_cpu_seconds(pid):
    """A forking server's CPU: its own, its reaped children's and its live children's."""
    def fields(path):
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()

    own = fields(f"/proc/{pid}/stat")
    ticks = sum(int(own[i]) for i in (11, 12, 13, 14))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            child = fields(f"/proc/{entry}/stat")
        except OSError:
            continue
        if child[1] == str(pid):
            ticks += int(child[11]) + int(child[12])
    return ticks / CLK_TCK


def pg_bin(name):
    dirs = sorted((os.path.join("/usr/lib/postgresql", v, "bin") for v in os.listdir("/usr/lib/postgresql")),
                  key=lambda d: [int(x) for x in re.findall(r"\d+", d)], reverse=True) \
        if os.path.isdir("/usr/lib/postgresql") else []
    if os.environ.get("PG_BIN_DIR"):
        dirs.insert(0, os.environ["PG_BIN_DIR"])
    for d in dirs:
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install PostgreSQL's server (Debian: postgresql)")
    return found


class PostgresServer:
    """A throw-away cluster on 127.0.0.1 (trust, fsync off), the database made again per size."""

    db = "sweep"

    def __init__(self, statements):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="inbox-sweep-pg-")
        self.run_as = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")  # PostgreSQL does not run as root
            self.run_as = (user.pw_uid, user.pw_gid)
            os.chown(self.dir, *self.run_as)
        drop = (lambda: (os.setgid(self.run_as[1]), os.setuid(self.run_as[0]))) if self.run_as else None
        data = os.path.join(self.dir, "data")
        subprocess.run([pg_bin("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                        "--no-sync"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       preexec_fn=drop, cwd=self.dir)
        extra = ["-c", "shared_preload_libraries=pg_stat_statements"] if statements else []
        self.proc = subprocess.Popen(
            [pg_bin("postgres"), "-D", data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
             "-c", "max_connections=200"] + extra,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "postgres.log"), "ab"), preexec_fn=drop, cwd=self.dir)
        deadline = time.time() + 30
        while self.psql("postgres", "SELECT 1", check=False) != "1":
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"postgres did not come up: see {self.dir}/postgres.log")
            time.sleep(0.1)
        self.version = self.psql("postgres", "SHOW server_version")
        self.statements = statements

    def psql(self, db, sql, check=True):
        out = subprocess.run([pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                              "-d", db, "-XAtq", "-F", "\t", "-c", sql], capture_output=True, text=True)
        if check and out.returncode != 0:
            raise RuntimeError(out.stderr)
        return out.stdout.strip()

    @property
    def url(self):
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.db}"

    def reset(self):
        self.psql("postgres", f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
        self.psql("postgres", f"CREATE DATABASE {self.db}")
        if self.statements:
            self.psql(self.db, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def cpu(self):
        return tree_cpu_seconds(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def drain(binary, url, n, workers, ordered, store_cpu, before_go=None):
    """Queues n entries, then times their drain: (seconds, the process's CPU, the store's CPU)."""
    argv = [binary, url, str(n), "--workers", str(workers), "--wait"] + (["--ordered"] if ordered else [])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("queued "):
            raise RuntimeError(f"inbox_drain: {line!r} (exit {proc.wait()})")
        queued = int(line.split()[1])
        if queued != n:
            raise RuntimeError(f"inbox_drain queued {queued} of {n}")
        if before_go:
            before_go()
        store0 = store_cpu() if store_cpu else 0.0
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        store1 = store_cpu() if store_cpu else 0.0
        m = re.match(r"drained (\d+) in ([\d.]+) s, cpu ([\d.]+) s", line)
        if not m:
            raise RuntimeError(f"inbox_drain: {line!r} (exit {proc.wait()})")
        if proc.wait(60) != 0:
            raise RuntimeError(f"inbox_drain exited {proc.returncode}")
        return float(m.group(2)), float(m.group(3)), store1 - store0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", required=True, help="backlog sizes, comma-separated (e.g. 10000,50000,200000)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="of memory,redis,postgres,sqlite (default all)")
    p.add_argument("--workers", type=int, default=32, help="entries at once per worker (default 32)")
    p.add_argument("--ordered", action="store_true", help="ordered entries (1 000 objects); unordered by default")
    p.add_argument("--pg-statements", action="store_true",
                   help="load pg_stat_statements and print the statements of each PostgreSQL drain by total time")
    p.add_argument("--drain", default=os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"),
                                                   "release", "examples", "inbox_drain"))
    p.add_argument("--json", help="also write the figures to this file")
    args, _ = p.parse_known_args()
    sizes = [int(s) for s in args.sweep.split(",")]
    backends = args.backends.split(",")
    for b in backends:
        if b not in BACKENDS:
            p.error(f"unknown backend {b!r}")

    rows = []
    for backend in backends:
        redis = pg = tmp = None
        try:
            if backend == "redis":
                redis = RedisServer(None)
            elif backend == "postgres":
                pg = PostgresServer(args.pg_statements)
            elif backend == "sqlite":
                tmp = tempfile.mkdtemp(prefix="inbox-sweep-sqlite-")
            for n in sizes:
                before_go = store_cpu = None
                if backend == "memory":
                    url = "memory:"
                elif backend == "redis":
                    redis.admin.cmd("FLUSHALL")
                    url = redis.url
                    store_cpu = lambda: cpu_seconds(redis.proc.pid)  # noqa: E731
                    before_go = lambda: redis.admin.cmd("CONFIG", "RESETSTAT")  # noqa: E731
                elif backend == "postgres":
                    pg.reset()
                    url = pg.url
                    store_cpu = pg.cpu

                    def before_go():
                        pg.psql(pg.db, "ANALYZE")
                        if pg.statements:
                            pg.psql(pg.db, "SELECT pg_stat_statements_reset()")
                else:
                    path = os.path.join(tmp, f"drain-{n}.db")
                    url = f"sqlite://{path}"
                log(f"{backend}: queueing {n} ...")
                seconds, own, store = drain(args.drain, url, n, args.workers, args.ordered, store_cpu, before_go)
                row = {"backend": backend, "pending": n, "seconds": seconds, "rate": n / seconds,
                       "cpu_process_us": own / n * 1e6, "cpu_store_us": store / n * 1e6,
                       "cpu_us": (own + store) / n * 1e6}
                if redis:
                    calls = sum(redis.commandstats().values())
                    row["redis_commands"] = calls / n
                if pg and pg.statements:
                    row["statements"] = pg.psql(pg.db, (
                        "SELECT round(total_exec_time::numeric, 1), calls, round(mean_exec_time::numeric, 3), "
                        "rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) FROM pg_stat_statements "
                        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                        "ORDER BY total_exec_time DESC LIMIT 8")).splitlines()
                log(f"{backend} {n}: {row['rate']:.0f} entries/s in {seconds:.2f} s, "
                    f"{row['cpu_process_us']:.0f} + {row['cpu_store_us']:.0f} us/entry"
                    + (f", {row['redis_commands']:.2f} Redis commands/entry" if redis else ""))
                for s in row.get("statements", []):
                    log("   ms total | calls | ms mean | rows | query:", s)
                if tmp:
                    for suffix in ("", "-wal", "-shm"):
                        try:
                            os.remove(path + suffix)
                        except OSError:
                            pass
                rows.append(row)
        finally:
            if redis:
                redis.stop()
            if pg:
                pg.stop()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)

    ordered = "ordered" if args.ordered else "unordered"
    print(f"\nBacklog sweep ({ordered}, {args.workers} workers, 1 KiB bodies; CPU per entry in µs: "
          "the draining process + the store's server)\n")
    print("| backend | pending | drain s | entries/s | CPU process | CPU store | CPU total |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['pending']} | {r['seconds']:.2f} | {r['rate']:.0f} | "
              f"{r['cpu_process_us']:.0f} | {r['cpu_store_us']:.0f} | {r['cpu_us']:.0f} |")
    print("\nLargest backlog against the smallest (goal: within 1.5x)\n")
    print("| backend | rate small/large | CPU per entry large/small | flat |")
    print("|---|---|---|---|")
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend]
        small, large = min(mine, key=lambda r: r["pending"]), max(mine, key=lambda r: r["pending"])
        rate, cpu = small["rate"] / large["rate"], large["cpu_us"] / small["cpu_us"]
        print(f"| {backend} | {rate:.2f}x | {cpu:.2f}x | {'yes' if max(rate, cpu) <= 1.5 else 'NO'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
