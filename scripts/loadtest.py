#!/usr/bin/env python3
"""The load test of scripts/loadtest: bare axum vs the idempotency layer on the memory store
vs on Redis, measured side by side in one run. Standard library only.

Run through `scripts/loadtest` (which installs wrk and redis-server and builds the server);
`scripts/loadtest --help` lists the options.

Everything runs on 127.0.0.1. The server (examples/loadtest_server.rs, one Tokio worker) is
pinned to CPU 0; wrk (one thread) and redis-server to CPU 1, so that the load generator never
competes with the server it measures (as Redis would live on another host). The variants are
interleaved in each of --rounds rounds, and medians are reported. Every loop is bounded in
count and time.

Writes to --out (default benches/results):
  loadtest.json  every sample and the medians
  loadtest.md    the tables
  loadtest.svg   req/s by concurrency per variant, server CPU per request, p99 latency
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import http.client

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
LUA = os.path.join(ROOT, "scripts", "wrk-loadtest.lua")
CLK_TCK = os.sysconf("SC_CLK_TCK")
VARIANTS = ("bare", "bare_spin", "memory", "memory_baseline", "redis")
MIXES = {"unique": 0.0, "dup80": 0.8}


# ---------------------------------------------------------------- helpers


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu):
    """A preexec_fn pinning the child to `cpu` (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def terminate(proc):
    """SIGTERM `proc` if it still runs, SIGKILL if it has not exited 10 s later; reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def whatsapp_payload(size=1024, messages=2):
    """A WhatsApp Cloud API batch of `messages` text messages, `size` bytes (the shape of
    benches/layer.rs)."""

    def doc(text_len):
        base = "Hola, tienen stock del modelo 42? "
        text = (base * (text_len // len(base) + 1))[:text_len]
        msgs = [
            {
                "from": "5491155550000",
                "id": f"wamid.HBgNNTQ5MTE1NTU1MDAwMBUCABIY{i:020d}",
                "timestamp": "1732950001",
                "type": "text",
                "text": {"body": text},
            }
            for i in range(messages)
        ]
        return json.dumps({
            "object": "whatsapp_business_account",
            "entry": [{"id": "102290129340398", "changes": [{"field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
                "contacts": [{"profile": {"name": "Lucia"}, "wa_id": "5491155550000"}],
                "messages": msgs,
            }}]}],
        }, separators=(",", ":")).encode()

    spare = size - len(doc(0))
    # Pad the last message's text to the exact size.
    body = doc(spare // messages)
    extra = size - len(body)
    if extra > 0:
        body = body.replace(b'"}}]}}]}]}', b" " * extra + b'"}}]}}]}]}')
    return body


# ---------------------------------------------------------------- Redis


class Resp:
    """A minimal RESP client over one socket (for administration and MONITOR)."""

    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))

    def read(self):
        line = self.file.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"unexpected RESP line {line!r}")

    def cmd(self, *args):
        self.send(*args)
        return self.read()

    def close(self):
        self.sock.close()


class RedisServer:
    def __init__(self, cpu):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="loadtest-redis-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
             "--logfile", os.path.join(self.dir, "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=pin(cpu))
        deadline = time.time() + 15
        while True:
            try:
                r = Resp(self.port, timeout=1)
                if r.cmd("PING") == "PONG":
                    r.close()
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not come up")
            time.sleep(0.05)
        self.admin = Resp(self.port)
        self.version = re.search(rb"redis_version:(\S+)", self.admin.cmd("INFO", "server")).group(1).decode()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def commandstats(self):
        """{command: calls} since the last CONFIG RESETSTAT, client-sent and Lua-run alike."""
        info = self.admin.cmd("INFO", "commandstats").decode()
        stats = {}
        for m in re.finditer(r"cmdstat_([a-z|_-]+):calls=(\d+)", info):
            stats[m.group(1)] = int(m.group(2))
        return stats

    def used_memory(self):
        info = self.admin.cmd("INFO", "memory").decode()
        return int(re.search(r"used_memory:(\d+)", info).group(1))

    def keys(self, pattern="ti:*", limit=100000):
        keys, cursor = [], b"0"
        for _ in range(10000):  # bounded
            cursor, batch = self.admin.cmd("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            keys.extend(batch)
            if cursor == b"0" or len(keys) >= limit:
                break
        return keys

    def stop(self):
        terminate(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Monitor:
    """MONITOR on a connection of its own: the commands clients send, Lua's left out."""

    LINE = re.compile(rb'^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')

    def __init__(self, port):
        self.conn = Resp(port, timeout=30)
        assert self.conn.cmd("MONITOR") == "OK"
        self.sections = {}
        self.port = port
        self.marker = f"loadtest-{os.getpid()}-{time.time_ns()}"
        self.lines = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        self.admin = Resp(port)
        self.mark("start")

    def _read(self):
        for _ in range(10_000_000):  # bounded
            line = self.conn.file.readline()
            if not line:
                return
            self.lines.append(line)
            if self.marker.encode() + b":end" in line:
                return

    def mark(self, name):
        self.admin.cmd("ECHO", f"{self.marker}:{name}")

    def finish(self):
        """{section: {COMMAND: count}}: the client commands between consecutive marks."""
        self.mark("end")
        self.thread.join(60)
        self.conn.close()
        self.admin.close()
        sections, current = {}, None
        for line in self.lines:
            if self.marker.encode() in line:
                current = line.split(self.marker.encode() + b":")[1].split(b'"')[0].decode()
                sections.setdefault(current, {})
                continue
            m = self.LINE.match(line)
            if not m or current is None:
                continue
            source, command = m.group(1), m.group(2).decode().upper()
            if source == b"lua":
                continue
            sections[current][command] = sections[current].get(command, 0) + 1
        return sections


# ---------------------------------------------------------------- server and load


class Server:
    def __init__(self, binary, variant, cpu, redis_url=None, spin_ns=0):
        env = dict(os.environ, VARIANT=variant, WORKERS="1", BIND="127.0.0.1:0", SPIN_NS=str(spin_ns))
        env.pop("RUST_LOG", None)
        if redis_url:
            env["REDIS_URL"] = redis_url
        self.proc = subprocess.Popen([binary], env=env, stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, preexec_fn=pin(cpu))
        line = self._first_line(30)
        m = re.match(r"listening on http://(127\.0\.0\.1:\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"server said {line!r}")
        self.addr = m.group(1)
        self.host, self.port = self.addr.split(":")

    def _first_line(self, timeout):
        result = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline().decode()))
        t.daemon = True
        t.start()
        t.join(timeout)
        if not result:
            self.stop()
            raise RuntimeError("the server did not start in time")
        return result[0]

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        terminate(self.proc)


def wrk(url, connections, duration, env, cpu):
    """Runs wrk with the Lua script; returns its WRKJSON figures and its own CPU seconds."""
    args = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "5s", "-s", LUA, url]
    proc = subprocess.Popen(args, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=pin(cpu))
    timer = threading.Timer(duration + 60, proc.kill)  # bounded
    timer.start()
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    proc.returncode = status
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if status != 0 or not m:
        raise RuntimeError(f"wrk failed ({status}): {out}\n{err}")
    result = json.loads(m.group(1))
    result["wrk_cpu_s"] = usage.ru_utime + usage.ru_stime
    return result


def fixed_requests(server, path, body, keys, expect_replayed):
    """Sends one request per key, sequentially, on one keep-alive connection; checks each."""
    conn = http.client.HTTPConnection(server.host, int(server.port), timeout=10)
    statuses = {}
    for key in keys:
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        resp = conn.getresponse()
        resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        replayed = resp.getheader("idempotent-replayed") == "true"
        if replayed != expect_replayed or resp.status >= 300:
            raise RuntimeError(f"{path} {key}: {resp.status}, replayed={replayed}")
    conn.close()
    return statuses


ADMIN = {"info", "config", "echo", "monitor", "ping", "scan", "memory", "flushall", "client",
         "hello", "script", "select", "command"}


def redis_costs(server, redis, body, n):
    """Commands per first delivery and per duplicate (MONITOR: client-sent only; commandstats:
    also what Lua ran), and Redis memory per retained key, in ack and in replay mode."""
    out = {}
    for mode, path in (("ack", "/webhook"), ("replay", "/orders")):
        redis.admin.cmd("FLUSHALL", "SYNC")
        keys = [f"costs-{mode}-{time.time_ns()}-{i}" for i in range(n)]
        monitor = Monitor(redis.port)
        redis.admin.cmd("CONFIG", "RESETSTAT")
        monitor.mark("first")
        fixed_requests(server, path, body, keys, expect_replayed=False)
        stats_first = redis.commandstats()
        redis.admin.cmd("CONFIG", "RESETSTAT")
        monitor.mark("duplicate")
        fixed_requests(server, path, body, keys, expect_replayed=True)
        stats_dup = redis.commandstats()
        sections = monitor.finish()
        stored = redis.keys()
        usage = [redis.admin.cmd("MEMORY", "USAGE", k, "SAMPLES", "0") for k in stored]
        values = [len(redis.admin.cmd("GET", k)) for k in stored[:100]]

        def client(section):
            return {k: v for k, v in sections.get(section, {}).items() if k.lower() not in ADMIN}

        def server_side(stats):
            return {k.upper(): v for k, v in stats.items() if k.split("|")[0] not in ADMIN}

        out[mode] = {
            "requests": n,
            "client_commands_first": client("first"),
            "client_commands_duplicate": client("duplicate"),
            "commandstats_first": server_side(stats_first),
            "commandstats_duplicate": server_side(stats_dup),
            "keys": len(stored),
            "memory_usage_mean": sum(usage) / len(usage) if usage else None,
            "memory_usage_min": min(usage) if usage else None,
            "memory_usage_max": max(usage) if usage else None,
            "value_bytes_mean": sum(values) / len(values) if values else None,
        }
    redis.admin.cmd("FLUSHALL", "SYNC")
    return out


# ---------------------------------------------------------------- report


def ratio(a, b):
    return a / b if a and b else None


def fmt_ratio(r):
    return "–" if r is None else f"{r:.2f}×"


def markdown(results):
    meta = results["meta"]
    runs = results["runs"]
    lines = [
        f"Measured {meta['date']} on {meta['machine']}.",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Server: `examples/loadtest_server.rs`, {meta['pinning']}. Load: wrk {meta['wrk']} with "
        f"`scripts/wrk-loadtest.lua`, keep-alive connections, `POST /webhook` with a "
        f"{meta['payload_bytes']} B WhatsApp-shaped JSON body and a new `Idempotency-Key` per "
        f"request (`unique`), or 80 % of requests repeating one of the last {meta['pool']} keys "
        f"(`dup80`). {meta['rounds']} rounds of {meta['duration']} s runs, the variants interleaved "
        f"within each round; every figure is the median over rounds, and `vs bare` the median of "
        f"the per-round ratios to bare axum at the same concurrency. Redis "
        f"{meta.get('redis_version', '–')} on 127.0.0.1."
        + (f" `bare_spin` is bare axum whose handler burns {meta['spin_ns']} ns of CPU per request "
           "(`--spin-ns`): a calibration of what a known per-request cost does to req/s here."
           if meta.get("spin_ns") else ""),
        "",
        "| variant | keys | conns | req/s | req/s vs bare | p50 ms | p99 ms | non-2xx | server CPU µs/req | CPU/req vs bare | redis CPU µs/req | server CPU % | wrk CPU % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['variant']} | {r['mix']} | {r['connections']} | {r['rps']:,.0f} | "
            f"{fmt_ratio(r['rps_vs_bare'])} | {r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} | "
            f"{r['errors_status']:,.0f} | {r['server_cpu_us_per_req']:.1f} | {fmt_ratio(r['cpu_vs_bare'])} | "
            + (f"{r['redis_cpu_us_per_req']:.1f}" if r.get("redis_cpu_us_per_req") is not None else "–")
            + f" | {r['server_cpu_pct']:.0f} | {r['wrk_cpu_pct']:.0f} |")
    lines += ["", "Peak RSS of each server process (VmHWM, after all its runs). The memory store keeps every "
              "key it was sent, for the 72 h retention; bytes per key = (VmRSS − bare's VmRSS) / keys held:", "",
              "| variant | VmHWM MiB | VmRSS MiB | requests served | keys held | bytes per key |",
              "|---|---:|---:|---:|---:|---:|"]
    bare_rss = results["servers"].get("bare", {}).get("vmrss_kib")
    for v, info in results["servers"].items():
        keys = info.get("keys")
        per_key = f"{(info['vmrss_kib'] - bare_rss) * 1024 / keys:.0f}" if keys and bare_rss else "–"
        lines.append(f"| {v} | {info['vmhwm_kib'] / 1024:.1f} | {info['vmrss_kib'] / 1024:.1f} | "
                     f"{info['requests']:,} | {'–' if keys is None else f'{keys:,}'} | {per_key} |")
    costs = results.get("redis_costs")
    if costs:
        n = costs["ack"]["requests"]

        def per(d):
            total = sum(d.values())
            parts = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(d.items()))
            return f"**{total / n:.2f}** ({parts})"

        lines += ["", f"Redis per delivery ({n} sequential deliveries, then the same {n} again as "
                  "duplicates). Client-sent commands come from `MONITOR`, which leaves out what Lua "
                  "scripts run; `INFO commandstats` counts those too. Memory is `MEMORY USAGE key "
                  "SAMPLES 0` of every retained key (`/webhook` for ack mode, `/orders`, a 201 with "
                  "`location` and a 44 B JSON body, for replay mode):", "",
                  "| mode | first: client-sent | first: commandstats | duplicate: client-sent | duplicate: commandstats | MEMORY USAGE per key (B) | value (B) |",
                  "|---|---|---|---|---|---:|---:|"]
        for mode in ("ack", "replay"):
            c = costs[mode]
            lines.append(
                f"| {mode} | {per(c['client_commands_first'])} | {per(c['commandstats_first'])} | "
                f"{per(c['client_commands_duplicate'])} | {per(c['commandstats_duplicate'])} | "
                f"{c['memory_usage_mean']:.0f} (min {c['memory_usage_min']}, max {c['memory_usage_max']}) | "
                f"{c['value_bytes_mean']:.0f} |")
    return "\n".join(lines) + "\n"


COLORS = {"bare": "#6b7280", "bare_spin": "#d1d5db", "memory": "#2563eb", "memory_baseline": "#93c5fd", "redis": "#dc2626"}
NAMES = {"bare": "bare axum", "bare_spin": "bare axum + a handler burning --spin-ns of CPU", "memory": "layer, memory store", "memory_baseline": "layer, memory store (baseline build)",
         "redis": "layer, Redis store"}


def nice_top(value):
    """A round axis top, 4 round ticks, at least `value`."""
    if value <= 0:
        return 1
    step = value / 4
    base = 10 ** math.floor(math.log10(step))
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * base >= step:
            return 4 * m * base
    return value


def svg(results):
    """Four panels: req/s (unique keys), req/s (dup80), server CPU per request and p99 latency
    (unique keys)."""
    runs = results["runs"]
    concs = sorted({r["connections"] for r in runs})
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
    panels = [
        ("req/s, unique keys", "unique", "rps", lambda x: f"{x / 1000:.0f}k"),
        ("req/s, 80 % duplicates (bare: unique)", "dup80", "rps", lambda x: f"{x / 1000:.0f}k"),
        ("server CPU µs per request, unique keys", "unique", "server_cpu_us_per_req", lambda x: f"{x:.1f}"),
        ("p99 latency (ms), unique keys", "unique", "p99_us", lambda x: f"{x / 1000:.1f}"),
    ]
    pw, ph, ml, mt, mb = 300, 230, 50, 40, 40
    width, height = ml + len(panels) * (pw + 30) + 10, mt + ph + mb + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">'
           f'tower-idempotency load test ({results["meta"]["date"]}, {results["meta"]["cpus"]} '
           f'CPUs, server on one core)</text>']
    for i, (title, mix, field, label) in enumerate(panels):
        x0, y0 = ml + i * (pw + 30), mt
        data = {}
        for r in runs:
            if r["mix"] == mix or r["variant"].startswith("bare"):
                data[(r["variant"], r["connections"])] = r[field]
        top = nice_top(max(data.values(), default=1) * 1.1)
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 - 6}" text-anchor="middle" font-weight="bold">{title}</text>')
        out.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw}" y2="{y0 + ph}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + ph}" stroke="black"/>')
        for t in range(5):
            v = top * t / 4
            y = y0 + ph - ph * t / 4
            out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + pw}" y2="{y}" stroke="#e5e7eb"/>')
            out.append(f'<text x="{x0 - 4}" y="{y + 4}" text-anchor="end">{label(v)}</text>')
        gw = pw / len(concs)
        bw = (gw - 16) / max(1, len(variants))
        for j, c in enumerate(concs):
            gx = x0 + j * gw + 8
            out.append(f'<text x="{x0 + j * gw + gw / 2}" y="{y0 + ph + 14}" text-anchor="middle">{c} conns</text>')
            for k, v in enumerate(variants):
                val = data.get((v, c))
                if val is None:
                    continue
                h = ph * val / top
                out.append(f'<rect x="{gx + k * bw:.1f}" y="{y0 + ph - h:.1f}" width="{bw - 2:.1f}" '
                           f'height="{h:.1f}" fill="{COLORS[v]}"><title>{v} {c}: {label(val)}</title></rect>')
                out.append(f'<text x="{gx + k * bw + bw / 2 - 1:.1f}" y="{y0 + ph - h - 3:.1f}" '
                           f'text-anchor="middle" font-size="8">{label(val)}</text>')
    lx = ml
    for v in variants:
        out.append(f'<rect x="{lx}" y="{height - 22}" width="12" height="12" fill="{COLORS[v]}"/>')
        out.append(f'<text x="{lx + 16}" y="{height - 12}">{NAMES[v]}</text>')
        lx += 40 + 6 * len(NAMES[v])
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def aggregate(samples):
    """One row per (variant, keys, connections): the median over rounds of every figure, and
    of the per-round ratio to bare axum at the same concurrency in the same round."""
    bare = {(s["round"], s["connections"]): s for s in samples if s["variant"] == "bare"}
    rows = []
    for v in VARIANTS:
        for mix in MIXES:
            for c in sorted({s["connections"] for s in samples}):
                group = [s for s in samples if (s["variant"], s["mix"], s["connections"]) == (v, mix, c)]
                if not group:
                    continue
                row = {"variant": v, "mix": mix, "connections": c, "rounds": len(group)}
                for field in ("rps", "p50_us", "p90_us", "p99_us", "errors_status", "server_cpu_us_per_req",
                              "server_cpu_pct", "redis_cpu_us_per_req", "wrk_cpu_pct"):
                    row[field] = median(s.get(field) for s in group)
                row["rps_vs_bare"] = median(
                    s["rps"] / bare[(s["round"], c)]["rps"] for s in group if (s["round"], c) in bare)
                row["cpu_vs_bare"] = median(
                    s["server_cpu_us_per_req"] / bare[(s["round"], c)]["server_cpu_us_per_req"]
                    for s in group if (s["round"], c) in bare)
                rows.append(row)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default=os.path.join(ROOT, "target", "release", "examples", "loadtest_server"))
    p.add_argument("--duration", type=int, default=4, help="seconds per run (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every run; medians are reported (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up seconds per server (default 2)")
    p.add_argument("--connections", default="16,64,256", help="concurrency levels (default 16,64,256)")
    p.add_argument("--variants", default="bare,memory,redis",
                   help="bare,memory,redis (default), and memory_baseline with --baseline-server")
    p.add_argument("--baseline-server", help="another build of loadtest_server, run as variant memory_baseline "
                   "(VARIANT=memory), to compare two builds of the layer in one run")
    p.add_argument("--spin-ns", type=int, default=0,
                   help="adds variant bare_spin: bare axum whose handler burns this many ns of CPU per "
                   "request, a calibration of what a per-request cost does to req/s on this machine")
    p.add_argument("--pool", type=int, default=10000, help="recent keys a dup80 run repeats from")
    p.add_argument("--costs", type=int, default=1000, help="requests of each kind for the Redis cost figures")
    p.add_argument("--out", default=os.path.join(ROOT, "benches", "results"))
    p.add_argument("--command", default="scripts/loadtest", help="the command line to report")
    args = p.parse_args()

    connections = [int(c) for c in args.connections.split(",")]
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    if args.baseline_server and "memory_baseline" not in variants:
        variants.insert(variants.index("memory") + 1 if "memory" in variants else 1, "memory_baseline")
    assert "memory_baseline" not in variants or args.baseline_server, "memory_baseline needs --baseline-server"
    if args.spin_ns and "bare_spin" not in variants:
        variants.insert(variants.index("bare") + 1 if "bare" in variants else 0, "bare_spin")
    assert "bare_spin" not in variants or args.spin_ns > 0, "bare_spin needs --spin-ns"
    NAMES["bare_spin"] = f"bare axum + {args.spin_ns / 1000:g} µs of handler CPU"
    assert variants and 1 <= args.duration <= 120 and 0 <= args.warmup <= 60 and 1 <= args.rounds <= 20
    allowed = sorted(os.sched_getaffinity(0))
    cpus = len(allowed)
    server_cpu, client_cpu = (allowed[0], allowed[1]) if cpus >= 2 else (None, None)

    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="loadtest-")
    body = whatsapp_payload()
    body_path = os.path.join(tmp, "body.json")
    with open(body_path, "wb") as f:
        f.write(body)
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    results = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{model}, {cpus} vCPUs (KVM), {memory_gib} GiB, Linux {platform.release()}, shared with other work",
            "cpus": cpus,
            "command": args.command,
            "wrk": re.sub(r"\s*\[.*", "", wrk_version).replace("wrk ", ""),
            "duration": args.duration,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "payload_bytes": len(body),
            "pool": args.pool,
            "spin_ns": args.spin_ns,
            "pinning": f"server (one Tokio worker) on CPU {server_cpu}; wrk (one thread) and redis-server on CPU {client_cpu}"
            if server_cpu is not None else "unpinned (one CPU)",
        },
        "samples": [],
        "servers": {},
    }
    redis = None
    servers = {}
    served = {v: 0 for v in variants}
    try:
        if "redis" in variants:
            redis = RedisServer(client_cpu)
            results["meta"]["redis_version"] = redis.version
        for v in variants:
            if v == "memory_baseline":
                servers[v] = Server(args.baseline_server, "memory", server_cpu)
            elif v == "bare_spin":
                servers[v] = Server(args.server, "bare", server_cpu, spin_ns=args.spin_ns)
            else:
                servers[v] = Server(args.server, v, server_cpu, redis.url if v == "redis" else None)
        run_id = str(time.time_ns())
        for v in variants:
            if args.warmup:
                log(f"== {v}: warm-up {args.warmup} s")
                env = {"LT_BODY": body_path, "LT_RUN": f"{run_id}-{v}-warm"}
                served[v] += wrk(f"http://{servers[v].addr}/webhook", connections[0], args.warmup, env, client_cpu)["requests"]
        for rnd in range(args.rounds):
            log(f"== round {rnd + 1}/{args.rounds}")
            for mix in MIXES:
                for c in connections:
                    for v in variants:
                        if v.startswith("bare") and mix != "unique":
                            continue  # bare axum ignores keys
                        server = servers[v]
                        env = {"LT_BODY": body_path, "LT_RUN": f"{run_id}-{rnd}-{v}-{mix}-{c}",
                               "LT_MIX": str(MIXES[mix]), "LT_POOL": str(args.pool)}
                        cpu0 = cpu_seconds(server.pid)
                        rcpu0 = cpu_seconds(redis.proc.pid) if v == "redis" else None
                        r = wrk(f"http://{server.addr}/webhook", c, args.duration, env, client_cpu)
                        cpu1 = cpu_seconds(server.pid)
                        served[v] += r["requests"]
                        seconds = r["duration_us"] / 1e6
                        sample = {
                            "round": rnd, "variant": v, "mix": mix, "connections": c,
                            "rps": r["requests"] / seconds,
                            "server_cpu_us_per_req": (cpu1 - cpu0) * 1e6 / r["requests"],
                            "server_cpu_pct": (cpu1 - cpu0) / seconds * 100,
                            "wrk_cpu_pct": r["wrk_cpu_s"] / seconds * 100,
                            **r,
                        }
                        if v == "redis":
                            sample["redis_cpu_us_per_req"] = (cpu_seconds(redis.proc.pid) - rcpu0) * 1e6 / r["requests"]
                        results["samples"].append(sample)
                        log(f"   {v:6} {mix:6} c={c:3}: {sample['rps']:9,.0f} req/s  p50 {r['p50_us'] / 1000:6.2f} ms  "
                            f"p99 {r['p99_us'] / 1000:6.2f} ms  non-2xx {r['errors_status']:5}  "
                            f"server CPU {sample['server_cpu_pct']:3.0f} % ({sample['server_cpu_us_per_req']:.1f} µs/req)  "
                            f"wrk CPU {sample['wrk_cpu_pct']:.0f} %")
        for v, server in servers.items():
            results["servers"][v] = {
                "vmhwm_kib": proc_status_kib(server.pid, "VmHWM"),
                "vmrss_kib": proc_status_kib(server.pid, "VmRSS"),
                "requests": served[v],
            }
            if v.startswith("memory"):
                conn = http.client.HTTPConnection(server.host, int(server.port), timeout=30)
                conn.request("GET", "/keys")
                resp = conn.getresponse()
                text = resp.read()
                if resp.status == 200:
                    results["servers"][v]["keys"] = int(text)
                conn.close()
        if redis:
            log(f"== redis: commands and memory per key ({args.costs} requests of each kind)")
            # A fresh server: requests cut off at the end of the load runs leave background
            # releases behind (up to 16 store timeouts later), which would be counted here.
            servers["redis"].stop()
            servers["redis"] = Server(args.server, "redis", server_cpu, redis.url)
            redis.admin.cmd("FLUSHALL", "SYNC")
            results["redis_costs"] = redis_costs(servers["redis"], redis, body, args.costs)
    finally:
        for server in servers.values():
            server.stop()
        if redis:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    results["runs"] = aggregate(results["samples"])
    with open(os.path.join(args.out, "loadtest.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results)
    with open(os.path.join(args.out, "loadtest.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "loadtest.svg"), "w") as f:
        f.write(svg(results))
    print(md)


if __name__ == "__main__":
    main()
