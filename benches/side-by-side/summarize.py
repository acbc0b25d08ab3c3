#!/usr/bin/env python3
"""Turns the measurements benches/side-by-side/run.sh collected into the markdown report.

run.sh appends one JSON object per measurement to results.jsonl in its work folder:

  {"kind": "load", "server", "test", "json": <pollbox load --json file>,
   "ticks": server CPU ticks (utime+stime) over the run, "clk_tck",
   "user_ticks", "sys_ticks": the same apart (utime, stime; absent in older runs),
   "gen_user_s", "gen_sys_s", "wall_s",            # the generator, from /usr/bin/time
   "syscalls": total or null, "breakdown": file of `perf stat -x,` or null}
  {"kind": "wrk", "server", "test", "out": wrk's stdout file, "ticks", "clk_tck", "gen_...", "wall_s"}
  {"kind": "mem", "server", "keys", "boxes", "rss_start_kb", "rss_kb", "rss_settled_kb"}
  {"kind": "meta", ...}                              # header facts (load average, commit, ...)
  {"kind": "profile", "test", "file"}                # `perf report --stdio` output

Usage: summarize.py line RESULTS.jsonl      (one line about the last record, for progress)
       summarize.py table RESULTS.jsonl     (the whole report, markdown, on stdout)
"""

import json
import re
import sys

# The first three keep their places: the main table's ratio columns read them by index.
SERVERS = ["pollbox", "nginx", "axum", "minihttp", "pollbox-ring", "pollbox-send", "pollbox-before"]
SERVER_TITLES = {
    "pollbox": "pollbox (1 worker)",
    "pollbox-ring": "pollbox, io_uring = true",
    # Runs made while io_uring was the default (results/2026-11-22-ring.md).
    "pollbox-send": "pollbox, io_uring = false",
    "nginx": "nginx-light (1 worker)",
    "axum": "axum-baseline (1 thread)",
    # may_minihttp + serde into a typed struct of borrowed strings.
    "minihttp": "minihttp-baseline (1 may worker)",
    # Another build, for before/after rows (PERF_POLLBOX_BEFORE).
    "pollbox-before": "pollbox, before (PERF_POLLBOX_BEFORE)",
}
# Errors the generator finds in nginx's fixed answer by design: the payload names
# another key and its version never moves. They say nothing about the transport.
NGINX_EXPECTED_ERRORS = {"payload", "version"}


def load_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def answered(report):
    """Requests answered in the run, warm-up included (the CPU window covers it)."""
    return sum(op["requests"] + op.get("warmup_requests", 0) for op in report["ops"])


def answered_messages(report):
    """Messages the server took in the run, warm-up included (the CPU window covers it):
    the accepted ones of the window, plus the warm-up's requests times their messages
    (the warm-up's answers are not checked one by one, so their messages are assumed
    accepted)."""
    total = 0
    for op in report["ops"]:
        per = {"batch": report.get("batch_size", 1), "ingest": 1}.get(op["op"], 0)
        total += op.get("messages_accepted", 0) + per * op.get("warmup_requests", 0)
    return total


def real_errors(server, report):
    errors = dict(report.get("errors", {}))
    if server == "nginx":
        for kind in NGINX_EXPECTED_ERRORS:
            errors.pop(kind, None)
    return sum(errors.values())


def derive(rec):
    """Numbers of one load/wrk record: rate, CPU per request, latencies, syscalls."""
    out = {"server": rec["server"], "test": rec["test"]}
    wall = rec.get("wall_s") or 0.0
    gen_cpu = (rec.get("gen_user_s") or 0.0) + (rec.get("gen_sys_s") or 0.0)
    out["gen_cores"] = gen_cpu / wall if wall > 0 else None
    server_s = rec["ticks"] / rec["clk_tck"] if rec.get("ticks") is not None else None
    out["server_cores"] = server_s / wall if server_s is not None and wall > 0 else None
    user_s = rec["user_ticks"] / rec["clk_tck"] if rec.get("user_ticks") is not None else None
    sys_s = rec["sys_ticks"] / rec["clk_tck"] if rec.get("sys_ticks") is not None else None

    def per(n, seconds):
        return seconds * 1e6 / n if seconds is not None and n else None
    if rec["kind"] == "load":
        report = read_json(rec["json"])
        if report is None:
            out["missing"] = True
            return out
        n = answered(report)
        out["rate"] = report["achieved_rate"]
        out["requests"] = n
        out["lat"] = report["latency_ms"]
        out["buckets"] = report.get("latency_buckets_ns")
        out["errors"] = real_errors(rec["server"], report)
        out["error_kinds"] = report.get("errors", {})
        out["offered"] = report.get("offered_rate")
        out["cpu_us"] = per(n, server_s)
        out["user_us"] = per(n, user_s)
        out["sys_us"] = per(n, sys_s)
        m = answered_messages(report)
        if m:
            out["messages"] = m
            out["msg_rate"] = report.get("messages_per_s")
            out["cpu_us_msg"] = per(m, server_s)
            out["user_us_msg"] = per(m, user_s)
            out["sys_us_msg"] = per(m, sys_s)
        if rec.get("syscalls") is not None and n:
            out["syscalls_per_req"] = rec["syscalls"] / n
            switches = parse_perf_stat(rec["breakdown"], "context-switches").get("context-switches")
            if switches is not None:
                out["switches_per_req"] = switches / n
    elif rec["kind"] == "wrk":
        text = open(rec["out"]).read()
        m = re.search(r"Requests/sec:\s+([\d.]+)", text)
        total = re.search(r"(\d+) requests in", text)
        bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
        errs = re.search(r"Socket errors:.*", text)
        out["rate"] = float(m.group(1)) if m else None
        n = int(total.group(1)) if total else 0
        out["requests"] = n
        out["errors"] = int(bad.group(1)) if bad else 0
        out["socket_errors"] = errs.group(0) if errs else ""
        out["cpu_us"] = per(n, server_s)
        out["user_us"] = per(n, user_s)
        out["sys_us"] = per(n, sys_s)
    return out


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def pooled_percentiles(ds):
    """Percentiles (ms) of all the runs' samples together: the runs' histograms merged by
    adding the counts of equal buckets. None unless every run carries its buckets."""
    if not ds or any(not d.get("buckets") for d in ds):
        return None
    counts = {}
    for d in ds:
        for value, count in d["buckets"]:
            counts[value] = counts.get(value, 0) + count
    values = sorted(counts)
    total = sum(counts.values())
    out = {}
    for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999)):
        # The smallest value with at least q of the samples at or below it (HdrHistogram's
        # value_at_quantile).
        need, seen = max(1, -(-int(q * total * 1_000_000) // 1_000_000)), 0
        for v in values:
            seen += counts[v]
            if seen >= need:
                out[name] = v / 1e6
                break
    out["max"] = values[-1] / 1e6
    out["samples"] = total
    return out


def aggregate(ds):
    """The median of each number over the repetitions of one server and test (each
    number on its own: the median p99 and the median CPU may come from different runs)."""
    ds = [d for d in ds if not d.get("missing")]
    if not ds:
        return {"missing": True}
    out = {"server": ds[0]["server"], "test": ds[0]["test"], "reps": len(ds)}
    for field in (
        "rate", "cpu_us", "user_us", "sys_us", "msg_rate", "cpu_us_msg", "user_us_msg", "sys_us_msg",
        "gen_cores", "server_cores", "syscalls_per_req", "switches_per_req", "requests",
    ):
        out[field] = median([d.get(field) for d in ds])
    if all("lat" in d for d in ds):
        out["lat"] = {p: median([d["lat"][p] for d in ds]) for p in ds[0]["lat"]}
        out["lat_range"] = {p: (min(d["lat"][p] for d in ds), max(d["lat"][p] for d in ds)) for p in ds[0]["lat"]}
    out["pooled"] = pooled_percentiles(ds)
    out["errors"] = sum(d.get("errors") or 0 for d in ds)
    kinds = {}
    for d in ds:
        for k, v in (d.get("error_kinds") or {}).items():
            kinds[k] = kinds.get(k, 0) + v
    out["error_kinds"] = kinds
    out["socket_errors"] = "; ".join(d["socket_errors"] for d in ds if d.get("socket_errors"))
    return out


def fmt(x, digits=1):
    if x is None:
        return "—"
    if isinstance(x, float) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}×"


def line(records):
    rec = records[-1]
    if rec["kind"] in ("load", "wrk"):
        d = derive(rec)
        if d.get("missing"):
            return f"  {rec['server']:8} {rec['test']:16} no report (see the work folder)"
        parts = [f"  {d['server']:10} {d['test']:23} #{rec.get('rep', 1)} {fmt(d.get('rate'))} req/s"]
        if d.get("cpu_us") is not None:
            parts.append(f"server {d['cpu_us']:.2f} µs/req")
        if d.get("user_us") is not None and d.get("sys_us") is not None:
            parts.append(f"(user {d['user_us']:.2f} sys {d['sys_us']:.2f})")
        if d.get("msg_rate") and d["test"].startswith("ingest-batch"):
            parts.append(f"{fmt(d['msg_rate'])} msg/s")
        if "lat" in d:
            lat = d["lat"]
            parts.append(f"p50 {lat['p50']:.3f} p99 {lat['p99']:.3f} p99.9 {lat['p999']:.3f} ms")
        if d.get("syscalls_per_req") is not None:
            parts.append(f"{d['syscalls_per_req']:.3f} syscalls/req")
        if d.get("gen_cores") is not None:
            parts.append(f"gen {100 * d['gen_cores']:.0f}% cpu")
        if d.get("server_cores") is not None:
            parts.append(f"server {100 * d['server_cores']:.0f}% cpu")
        if d.get("errors"):
            parts.append(f"ERRORS {d['errors']} {d.get('error_kinds', d.get('socket_errors', ''))}")
        return ", ".join(parts)
    if rec["kind"] == "mem":
        return (
            f"  {rec['server']:8} mem {rec['keys']} keys: boxes {rec['boxes']}, "
            f"RSS {rec['rss_kb'] / 1024:.1f} MiB (settled {rec['rss_settled_kb'] / 1024:.1f} MiB)"
        )
    return f"  {rec['kind']}"


def verdict(ok):
    if ok is None:
        return "—"
    return "met" if ok else "**missed**"


def table(records):
    meta = {}
    for r in records:
        if r["kind"] == "meta":
            meta.update({k: v for k, v in r.items() if k != "kind"})
    every = {}
    for r in records:
        if r["kind"] in ("load", "wrk"):
            d = derive(r)
            d["rep"] = r.get("rep", 1)
            every.setdefault((r["server"], r["test"]), []).append(d)
    runs = {key: aggregate(ds) for key, ds in every.items()}

    def get(server, test, field):
        d = runs.get((server, test))
        return None if d is None else d.get(field)

    out = []
    w = out.append
    w(f"# pollbox side-by-side benchmark — {meta.get('date', '?')}")
    w("")
    w(f"- command: `{meta.get('command', 'benches/side-by-side/run.sh')}`")
    w(f"- commit: `{meta.get('commit', '?')}`; machine: {meta.get('machine', '?')}")
    w(
        f"- pinning: servers on core {meta.get('server_cpu')} (taskset), generator on core "
        f"{meta.get('load_cpu')}; both at nice {meta.get('nice')}; each number is the median of "
        f"{meta.get('reps')} runs of {meta.get('duration')} s (after a {meta.get('warmup')} s warm-up), "
        f"the servers' runs interleaved; {meta.get('connections')} connections, "
        f"keys lg-0..lg-{int(meta.get('keys', 1000)) - 1} pre-seeded; syscall counts: one run of "
        f"{meta.get('syscall_duration')} s per server"
    )
    w(f"- load average before: `{meta.get('uptime_before', '?')}`; after: `{meta.get('uptime_after', '?')}`")
    for when in ("before", "after"):
        if meta.get(f"busy_{when}"):
            w(f"- other busy processes {when} the run (%CPU over their lifetime, command): {meta[f'busy_{when}']}")
    w(f"- raw data: `{meta.get('work', '?')}`")
    w("")
    w("## Side by side")
    w("")
    w(
        "CPU is the server's utime+stime from /proc/PID/stat over the run divided by the "
        "requests answered. Latency is `pollbox load` open-loop (from intended send time)."
    )
    w("")
    # Columns for the servers measured only; `vals` below still holds every server of
    # SERVERS in order (the checks read pollbox, nginx, axum by index).
    shown = [i for i, s in enumerate(SERVERS) if any(k[0] == s for k in runs)]
    ratios = [
        (SERVERS.index(a), SERVERS.index(b))
        for a, b in (("pollbox", "nginx"), ("axum", "nginx"), ("pollbox", "minihttp"))
        if SERVERS.index(a) in shown and SERVERS.index(b) in shown
    ]
    head = "| measure | " + " | ".join(SERVER_TITLES[SERVERS[i]] for i in shown)
    head += "".join(f" | {SERVERS[a]} / {SERVERS[b]}" for a, b in ratios)
    w(head + " | target | pollbox |")
    w("|---|" + "---:|" * (len(shown) + len(ratios)) + "---|---|")

    def cells_of(vals, digits):
        cells = [fmt(vals[i], digits) for i in shown]
        cells += [fmt_ratio(vals[a], vals[b]) for a, b in ratios]
        return " | ".join(cells)

    def row(label, test, field, digits=1, target=None, check=None, scale=1.0):
        vals = [get(s, test, field) for s in SERVERS]
        vals = [None if v is None else v * scale for v in vals]
        ok = check(vals) if check and None not in (vals[0],) else None
        w(f"| {label} | {cells_of(vals, digits)} | {target or ''} | {verdict(ok) if check else ''} |")

    def le_nginx(factor):
        return lambda v: v[1] is not None and v[0] <= factor * v[1]

    def latency_rows(label, test):
        """p50/p99/p99.9 of all the runs' samples pooled (the histograms merged) when
        the runs carry their buckets, else the median over runs; with the range of the
        single runs, and in how many interleaved repetitions pollbox was at or below nginx."""
        pooled = [get(s, test, "pooled") for s in SERVERS]
        per_run = {s: {d["rep"]: d for d in every.get((s, test), []) if d.get("lat")} for s in SERVERS}
        for p, name in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")):
            if all(x is not None for x in pooled[:2]):
                vals = [None if x is None else x[p] for x in pooled]
                how = "pooled"
            else:
                vals = [None if get(s, test, "lat") is None else get(s, test, "lat")[p] for s in SERVERS]
                how = "median"
            medians = [None if get(s, test, "lat") is None else get(s, test, "lat")[p] for s in SERVERS[:2]]
            ranges = [get(s, test, "lat_range") for s in SERVERS]
            spread = " / ".join(
                "—" if r is None else f"{r[p][0]:.3f}–{r[p][1]:.3f}" for r in ranges[:2]
            )
            reps = sorted(set(per_run["pollbox"]) & set(per_run["nginx"]))
            wins = sum(per_run["pollbox"][r]["lat"][p] <= per_run["nginx"][r]["lat"][p] for r in reps)
            ok = None if None in vals[:2] else vals[0] <= vals[1]
            target = "≤ nginx" if p != "p50" else ""
            w(
                f"| {label} @ {rate}: {name} ms ({how}; median of runs pollbox / nginx "
                f"{' / '.join(fmt(m, 3) for m in medians)}; single runs {spread}; "
                f"pollbox ≤ nginx in {wins} of {len(reps)} reps) | "
                + cells_of(vals, 3)
                + f" | {target} | {verdict(ok) if target else ''} |"
            )

    rate = f"{meta.get('rate', '?')}/s"
    row("closed-loop poll, req/s (1 generator thread)", "poll-closed", "rate", 0)
    row("  generator CPU in that run, %", "poll-closed", "gen_cores", 0, scale=100)
    row(f"poll @ {rate}: server CPU µs/req", "poll-open", "cpu_us", 2, "≤ nginx", le_nginx(1.0))
    latency_rows("poll", "poll-open")
    row(
        f"ingest {meta.get('body_bytes')} B @ {rate}: server CPU µs/req",
        "ingest-open",
        "cpu_us",
        2,
        "≤ 1.2× nginx",
        le_nginx(1.2),
    )
    latency_rows("ingest", "ingest-open")
    depth = meta.get("pipeline", 16)
    row(
        f"pipelined GET ×{depth} (pollbox load), req/s",
        "poll-pipelined",
        "rate",
        0,
        "≥ 1,000,000",
        lambda v: v[0] >= 1_000_000,
    )
    row("  server CPU µs/req", "poll-pipelined", "cpu_us", 3)
    row("  server CPU, % of its core", "poll-pipelined", "server_cores", 0, scale=100)
    row("  generator CPU, % of its core", "poll-pipelined", "gen_cores", 0, scale=100)
    row(f"pipelined GET ×{depth} (wrk + pipeline.lua), req/s", "poll-wrk", "rate", 0)
    row("  server CPU µs/req", "poll-wrk", "cpu_us", 3)
    row("  wrk CPU, % of its core", "poll-wrk", "gen_cores", 0, scale=100)
    row(f"pipelined ingest ×{depth} ({meta.get('body_bytes')} B), req/s", "ingest-pipelined", "rate", 0)
    row("  server CPU µs/req", "ingest-pipelined", "cpu_us", 3)
    row("  generator CPU, % of its core", "ingest-pipelined", "gen_cores", 0, scale=100)
    row(f"ingest {meta.get('body_bytes')} B closed loop, not pipelined, req/s", "ingest-closed", "rate", 0)
    row("  server CPU µs/req", "ingest-closed", "cpu_us", 3)
    batch = f"×{meta.get('batch_size', 100)} messages, pipeline {meta.get('batch_pipeline', 4)}"
    row(f"batch ingest ({batch}, {meta.get('body_bytes')} B), messages/s", "ingest-batch", "msg_rate", 0)
    row("  server CPU µs/message", "ingest-batch", "cpu_us_msg", 3)
    row("  server CPU, % of its core", "ingest-batch", "server_cores", 0, scale=100)
    row("  generator CPU, % of its core", "ingest-batch", "gen_cores", 0, scale=100)
    row(
        f"syscalls/req, poll @ {rate}",
        "poll-open-syscalls",
        "syscalls_per_req",
        3,
        "≤ 2",
        lambda v: v[0] <= 2.0,
    )
    row(
        f"syscalls/req, pipelined GET ×{depth} (closed loop)",
        "poll-pipelined-syscalls",
        "syscalls_per_req",
        3,
        "well below 1",
        lambda v: v[0] < 1.0,
    )
    row(
        f"syscalls/req, poll closed loop ({meta.get('connections')} connections, not pipelined)",
        "poll-closed-syscalls",
        "syscalls_per_req",
        3,
        "≤ 2",
        lambda v: v[0] <= 2.0,
    )
    row(f"  context switches/req, poll @ {rate}", "poll-open-syscalls", "switches_per_req", 3)
    row(
        f"  context switches/req, pipelined GET ×{depth}",
        "poll-pipelined-syscalls",
        "switches_per_req",
        4,
    )
    w("")

    # Errors, so that a fast wrong answer does not pass for a fast answer.
    bad = [d for d in runs.values() if d.get("errors")]
    if bad:
        w("Errors seen (nginx's payload/version mismatches excluded, they are by design):")
        for d in bad:
            w(f"- {d['server']} {d['test']}: {d['errors']} {d.get('error_kinds') or d.get('socket_errors')}")
    else:
        w(
            "No errors in any run (nginx's answers fail the generator's payload check by "
            "design, a fixed body cannot name the polled key; those are not counted)."
        )
    w("")

    cpu_split(w, meta, runs)

    # Syscall breakdown.
    breakdowns = [r for r in records if r["kind"] == "load" and r.get("breakdown")]
    if breakdowns:
        w("## Syscalls per request, by syscall (perf stat -e 'syscalls:sys_enter_*')")
        w("")
        cols = [(r["server"], r["test"]) for r in breakdowns]
        per = {}
        names = set()
        for r in breakdowns:
            d = runs.get((r["server"], r["test"]))
            n = d.get("requests") if d else None
            counts = parse_perf_stat(r["breakdown"])
            per[(r["server"], r["test"])] = (counts, n)
            names.update(k for k, v in counts.items() if n and v / n >= 0.001)
        w("| syscall | " + " | ".join(f"{s} {t.replace('-syscalls', '')}" for s, t in cols) + " |")
        w("|---|" + "---:|" * len(cols))
        order = sorted(names, key=lambda k: -max((c.get(k, 0) / n if n else 0) for c, n in per.values()))
        for k in order:
            cells = []
            for c in cols:
                counts, n = per[c]
                cells.append(f"{counts.get(k, 0) / n:.3f}" if n else "—")
            w(f"| {k} | " + " | ".join(cells) + " |")
        w("")

    mem = [r for r in records if r["kind"] == "mem"]
    if mem:
        w("## Memory (fresh server, every key ingested once with `pollbox load --preseed`)")
        w("")
        w("Verdict on the RSS 6 s after the ingest (jemalloc's dirty decay is 5 s); the peak right after is shown too.")
        w("")
        w("| server | keys | boxes reported | RSS at start | RSS after ingest | RSS 6 s later | bytes/box (settled − start) | target | verdict |")
        w("|---|---:|---:|---:|---:|---:|---:|---|---|")
        for r in mem:
            target, ok = "", None
            if r["server"] == "pollbox":
                limit = 25e6 if r["keys"] <= 100_000 else 200e6
                target = f"≤ {limit / 1e6:.0f} MB"
                # Judged on the settled RSS: right after the ingest burst jemalloc still
                # holds the dirty pages of the request buffers (both are shown).
                ok = r["rss_settled_kb"] * 1024 <= limit and r["boxes"] == r["keys"]
            per_box = (r["rss_settled_kb"] - r["rss_start_kb"]) * 1024 / r["keys"] if r["keys"] else 0
            w(
                f"| {r['server']} | {r['keys']:,} | {r['boxes']} | {r['rss_start_kb'] / 1024:.1f} MiB "
                f"| {r['rss_kb'] * 1024 / 1e6:.1f} MB ({r['rss_kb'] / 1024:.1f} MiB) "
                f"| {r['rss_settled_kb'] * 1024 / 1e6:.1f} MB | {per_box:.0f} | {target} | {verdict(ok) if target else ''} |"
            )
        w("")

    scale = [(k, d) for k, d in runs.items() if k[0].startswith("pollbox-w")]
    if scale:
        w("## Scaling: pollbox --workers 1 vs 2 (server may use both cores; see the method)")
        w("")
        w("| run | req/s | server CPU µs/req | server cores used | generator cores used | req/s per server core |")
        w("|---|---:|---:|---:|---:|---:|")
        for (server, test), d in sorted(scale):
            per_core = d["rate"] / d["server_cores"] if d.get("server_cores") else None
            w(
                f"| {server} {test} | {fmt(d.get('rate'), 0)} | {fmt(d.get('cpu_us'), 3)} "
                f"| {fmt(d.get('server_cores'), 2)} | {fmt(d.get('gen_cores'), 2)} | {fmt(per_core, 0)} |"
            )
        w1 = runs.get(("pollbox-w1", "poll-pipelined-2cores"))
        w2 = runs.get(("pollbox-w2", "poll-pipelined-2cores"))
        if w1 and w2 and w1.get("rate") and w1.get("server_cores") and w2.get("server_cores"):
            w("")
            w(
                f"workers 2 / workers 1: throughput {w2['rate'] / w1['rate']:.2f}×, server cores used "
                f"{w2['server_cores'] / w1['server_cores']:.2f}×, req/s per server core "
                f"{(w2['rate'] / w2['server_cores']) / (w1['rate'] / w1['server_cores']):.2f}× "
                "(1.00× = linear in cores)."
            )
        w("")

    w("## Every run (the spread behind the medians)")
    w("")
    w(
        "| server | test | run | req/s | server CPU µs/req | user µs/req | system µs/req | p50 ms | p99 ms "
        "| p99.9 ms | server % core | generator % core |"
    )
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (server, test), ds in every.items():
        for d in ds:
            lat = d.get("lat") or {}
            w(
                f"| {server} | {test} | {d['rep']} | {fmt(d.get('rate'), 0)} | {fmt(d.get('cpu_us'), 2)} "
                f"| {fmt(d.get('user_us'), 3)} | {fmt(d.get('sys_us'), 3)} "
                f"| {fmt(lat.get('p50'), 3)} | {fmt(lat.get('p99'), 3)} | {fmt(lat.get('p999'), 3)} "
                f"| {fmt(None if d.get('server_cores') is None else 100 * d['server_cores'], 0)} "
                f"| {fmt(None if d.get('gen_cores') is None else 100 * d['gen_cores'], 0)} |"
            )
    w("")

    profiles = [r for r in records if r["kind"] == "profile"]
    for r in profiles:
        w(f"## Profile: pollbox during {r['test']} (perf record -g, top symbols, self time)")
        w("")
        w("```")
        try:
            w(open(r["file"]).read().rstrip())
        except OSError:
            w("(no profile)")
        w("```")
        w("")
    return "\n".join(out)


# The tests behind the ratios against minihttp: what each one stands for in the summary line.
AGAINST_MINIHTTP = [
    ("ingest-closed", "single-message ingest, closed loop"),
    ("ingest-open", "single-message ingest at the fixed rate"),
    ("poll-closed", "poll, not pipelined (closed loop)"),
    ("poll-open", "poll, not pipelined, at the fixed rate"),
    ("poll-pipelined", "poll, pipelined"),
    ("ingest-pipelined", "single-message ingest, pipelined"),
    ("ingest-batch", "batch ingest, per message"),
]


def cpu_split(w, meta, runs):
    """User and system CPU per request, every server and test, with ratios against
    minihttp (the yardstick for parsing and framing costs is user CPU against may_minihttp's)."""
    tests = []
    for (_, test) in runs:
        if test not in tests and not test.endswith("-syscalls") and not test.endswith("-2cores"):
            tests.append(test)
    if not any(runs.get((s, t), {}).get("user_us") is not None for s in SERVERS for t in tests):
        return
    servers = [s for s in SERVERS if any((s, t) in runs for t in tests)]
    w("## User and system CPU per request, against minihttp")
    w("")
    w(
        "User and system time are the utime and stime of /proc/PID/stat (all threads) over the "
        "run, divided by the requests answered (warm-up included); for `ingest-batch` by the "
        "messages instead. Their sum is the kernel's precise run time, but the split between them "
        f"is sampled once per scheduler tick (CONFIG_HZ = {meta.get('hz', '?')}): over a run of "
        "n ticks the user share is known to about ±√(p(1−p)/n), some ±2 % of it for a 5 s run "
        "at full load. Loopback TCP work done in the server's system calls counts as its system "
        "time. Median of the runs; the ratios are of the medians."
    )
    w("")
    has_mini = "minihttp" in servers
    head = "| test | server | req/s | messages/s | user µs | system µs | user + system µs |"
    if has_mini:
        head += " user / minihttp | system / minihttp | total / minihttp |"
    w(head)
    w("|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if has_mini else ""))
    for test in tests:
        per_msg = test.startswith("ingest-batch")
        suffix = "_msg" if per_msg else ""
        base = runs.get(("minihttp", test)) or {}
        for server in servers:
            d = runs.get((server, test))
            if d is None or d.get("missing"):
                continue
            u, s_ = d.get("user_us" + suffix), d.get("sys_us" + suffix)
            tot = d.get("cpu_us" + suffix)
            label = f"{test} (per message)" if per_msg else test
            cells = [
                label,
                server,
                fmt(d.get("rate"), 0),
                fmt(d.get("msg_rate"), 0) if d.get("msg_rate") else "—",
                fmt(u, 3),
                fmt(s_, 3),
                fmt(tot, 3),
            ]
            if has_mini:
                cells += [
                    fmt_ratio(u, base.get("user_us" + suffix)),
                    fmt_ratio(s_, base.get("sys_us" + suffix)),
                    fmt_ratio(tot, base.get("cpu_us" + suffix)),
                ]
            w("| " + " | ".join(cells) + " |")
    w("")
    if has_mini and "pollbox" in servers:
        parts = []
        for test, what in AGAINST_MINIHTTP:
            p, m = runs.get(("pollbox", test)), runs.get(("minihttp", test))
            if not p or not m:
                continue
            suffix = "_msg" if test.startswith("ingest-batch") else ""
            parts.append(
                f"{what} (`{test}`): user {fmt_ratio(p.get('user_us' + suffix), m.get('user_us' + suffix))}, "
                f"system {fmt_ratio(p.get('sys_us' + suffix), m.get('sys_us' + suffix))}"
            )
        pb, mb = runs.get(("pollbox", "ingest-batch")), runs.get(("minihttp", "ingest-batch"))
        if pb and mb and pb.get("msg_rate") and mb.get("msg_rate"):
            parts.append(
                f"batch ingest messages/s: pollbox {fmt(pb['msg_rate'], 0)}, minihttp "
                f"{fmt(mb['msg_rate'], 0)} ({fmt_ratio(pb['msg_rate'], mb['msg_rate'])})"
            )
        if parts:
            w("pollbox / minihttp, CPU per request:")
            w("")
            for part in parts:
                w(f"- {part}")
            w("")


def parse_perf_stat(path, prefix="syscalls:sys_enter_"):
    """`perf stat -x,` lines: count,unit,event,... -> {event without prefix: count}."""
    counts = {}
    try:
        with open(path) as f:
            for raw in f:
                parts = raw.strip().split(",")
                if len(parts) < 3 or not parts[2].startswith(prefix):
                    continue
                try:
                    n = int(float(parts[0]))
                except ValueError:
                    continue
                name = parts[2][len(prefix):] or parts[2]
                if n or prefix == "context-switches":
                    counts[name] = counts.get(name, 0) + n
    except OSError:
        pass
    return counts


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("line", "table"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    records = load_records(sys.argv[2])
    if sys.argv[1] == "line":
        if records:
            print(line(records))
    else:
        print(table(records))


if __name__ == "__main__":
    main()
