#!/usr/bin/env python3
"""Static checks of deploy/ that need only python3 (called by deploy/check.sh).

  check_static.py configs        config copies agree; timeouts cover max_wait_ms;
                                 the Dockerfile's Rust matches rust-toolchain.toml;
                                 the k8s manifests reference each other correctly
                                 (HAProxy's Deployment, Service, Ingress against
                                 haproxy-k8s.cfg); the replicas' config, HAProxy and
                                 manifests fit a log
  check_static.py closed         closed by default: every config serves /metrics on
                                 metrics_listen, a port no Service, Ingress or HAProxy
                                 server names; HAProxy's client frontends deny /metrics;
                                 Prometheus scrapes that port; the k8s JWKS is a Secret
                                 of public keys, mounted read-only as a directory
  check_static.py dashboard      Grafana JSON is well formed and every panel queries
  check_static.py metrics        alerts and dashboard use only metric names pollbox exports
                                 (the log metrics: found in the exporter's source and the docs)
  check_static.py dashboard-rules OUT
                                 write the dashboard's queries as a Prometheus rule
                                 file, so `promtool check rules OUT` parses them
  check_static.py k8s-local DIR METRICS_PORT
                                 write deploy/k8s/configmap.yaml's config, runnable
                                 here (metrics on 127.0.0.1:METRICS_PORT, snapshot in
                                 DIR), and the Secret's JWKS laid out as Kubernetes
                                 mounts it, into DIR
  check_static.py probe-closed PORT METRICS_PORT
                                 a node running that config: /metrics 404 on PORT,
                                 200 on METRICS_PORT (nothing else there), a write
                                 without a token 401
  check_static.py live-metrics FILE
                                 every metric the alerts and dashboard use is in
                                 FILE, a /metrics scrape of a running pollbox (of a
                                 standalone one: but for the log metrics)

Each prints what it checked and exits 1 with the reasons on failure.
"""

import json
import os
import re
import sys

DEPLOY = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DEPLOY)

# The metrics pollbox exports (docs/operations.md#metrics). Histograms also expose _bucket/_sum/_count.
EXPORTED_METRICS = {
    "pollbox_http_requests_total",
    "pollbox_http_request_duration_seconds",
    "pollbox_ingest_messages_total",
    "pollbox_connections_open",
    "pollbox_connections_total",
    "pollbox_connections_rejected_total",
    "pollbox_bytes_received_total",
    "pollbox_bytes_sent_total",
    "pollbox_boxes",
    "pollbox_arena_resets_total",
    "pollbox_arena_reset_duration_seconds",
    "pollbox_arena_bytes",
    "pollbox_arena_high_water_bytes",
    "pollbox_epoch_overruns_total",
    "pollbox_accounted_bytes",
    "pollbox_jemalloc_allocated_bytes",
    "pollbox_jemalloc_active_bytes",
    "pollbox_jemalloc_resident_bytes",
    "pollbox_jemalloc_mapped_bytes",
    "pollbox_jemalloc_retained_bytes",
    "pollbox_jemalloc_metadata_bytes",
    "pollbox_jemalloc_dirty_bytes",
    "pollbox_jemalloc_fragmentation_bytes",
    "pollbox_worker_allocated_bytes_total",
    "pollbox_worker_deallocated_bytes_total",
    "pollbox_arena_capacity_bytes",
    "pollbox_arena_used_bytes",
    "pollbox_worker_connections",
    "pollbox_worker_busy_ratio",
    "pollbox_auth_refused_total",
    "pollbox_limit_refused_total",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
}
# Exported only by a node of a Kafka log ([log] brokers set; docs/operations.md#log-metrics),
# so a standalone scrape lacks them: check_metrics finds each in the exporter's source
# (crates/server/src/metrics/families.rs) and in the docs instead, and check.sh with
# DEPLOY_CHECK_KAFKA=1 scrapes a node of a real log.
LOG_METRICS = {
    "pollbox_log_records_total",
    "pollbox_log_consume_errors_total",
    "pollbox_log_client_errors_total",
    "pollbox_log_produce_errors_total",
    "pollbox_log_connected",
    "pollbox_log_caught_up",
    "pollbox_log_lag_records",
    "pollbox_log_next_offset",
    "pollbox_log_ack_seconds",
    "pollbox_log_halted",
    "pollbox_log_unsafe_topic",
}
EXPORTED_METRICS |= LOG_METRICS
HISTOGRAMS = {"pollbox_http_request_duration_seconds", "pollbox_arena_reset_duration_seconds",
              "pollbox_log_ack_seconds"}


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def configmap_toml(text):
    """The `pollbox.toml: |` block of the ConfigMap, de-indented (no YAML library needed)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "pollbox.toml: |":
            indent = len(line) - len(line.lstrip()) + 2
            out = []
            for body in lines[i + 1:]:
                if body.strip() and len(body) - len(body.lstrip()) < indent:
                    break
                out.append(body[indent:] if body.strip() else "")
            while out and out[-1] == "":
                out.pop()
            return "\n".join(out) + "\n"
    return None


def split_jwt(text):
    """(the TOML before its [auth.jwt] section, that section), or (text, "")."""
    base, found, jwt = text.partition("\n[auth.jwt]\n")
    return (base, "[auth.jwt]\n" + jwt) if found else (text, "")


def toml_value(text, section, key):
    current = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line.startswith(key) and "=" in line:
            return line.split("=", 1)[1].strip().strip('"')
    return None


def duration_s(text):
    m = re.fullmatch(r"(\d+)(ms|s|m)?", text)
    if not m:
        return None
    n = int(m.group(1))
    return {"ms": n / 1000, "s": n, "m": n * 60, None: n / 1000}[m.group(2)]


def check_configs():
    errors = []
    prod = read("deploy/systemd/pollbox.toml")
    cm = configmap_toml(read("deploy/k8s/configmap.yaml"))
    if cm is None:
        errors.append("deploy/k8s/configmap.yaml has no `pollbox.toml: |` block")
    else:
        base, jwt = split_jwt(cm)
        if base.rstrip() != prod.rstrip():
            errors.append("deploy/k8s/configmap.yaml's pollbox.toml, less its [auth.jwt], differs from deploy/systemd/pollbox.toml")
        if not jwt or re.search(r"^\[", jwt.split("\n", 1)[1], re.M):
            errors.append("deploy/k8s/configmap.yaml's pollbox.toml must end with [auth.jwt] and nothing after it")

    listen = toml_value(prod, "server", "listen")
    if listen != "0.0.0.0:8080":
        errors.append(f"production config listens on {listen!r}, expected 0.0.0.0:8080")
    snapshot = toml_value(prod, "snapshot", "path") or ""
    if not snapshot.startswith("/var/lib/pollbox/"):
        errors.append(f"snapshot path {snapshot!r} is not under /var/lib/pollbox (StateDirectory, volume)")
    max_wait_s = int(toml_value(prod, "limits", "max_wait_ms") or 30000) / 1000

    # Every timeout that a long-poll runs into must be longer than max_wait_ms.
    for rel in ("deploy/haproxy/haproxy.cfg", "deploy/haproxy/haproxy.cfg.tmpl", "deploy/haproxy/haproxy-k8s.cfg"):
        cfg = read(rel)
        for which in ("server", "client"):
            m = re.search(rf"^\s*timeout {which} (\S+)", cfg, re.M)
            got = duration_s(m.group(1)) if m else None
            if got is None or got <= max_wait_s:
                errors.append(f"{rel}: timeout {which} must exceed max_wait_ms ({max_wait_s:g} s)")
        if re.search(r"^\s*option redispatch", cfg, re.M) or "hash-balance-factor" in cfg.replace(
                "Do not set hash-balance-factor", ""):
            errors.append(f"{rel}: redispatch or hash-balance-factor would send keys to nodes not holding them")
        start = re.search(r"^backend pollbox$", cfg, re.M)
        routing = cfg[start.end():].split("\nbackend ", 1)[0] if start else ""
        if "balance hash path,url_dec" not in routing or "hash-type consistent" not in routing:
            errors.append(f"{rel}: backend pollbox must hash the decoded path consistently")
        if re.search(r"^\s*(server|default-server)\b.*\bcheck\b", routing, re.M):
            errors.append(f"{rel}: backend pollbox must not health-check (a down server's keys would be re-hashed)")
        errors += check_routing_retries(rel, routing)
        # Event streams and long-polls must pass as they are written.
        for bad in ("compression", "option http-buffer-request"):
            if re.search(rf"^\s*{bad}\b", cfg, re.M):
                errors.append(f"{rel}: `{bad}` holds responses or requests back (event streams, long-polls)")
        tls = re.search(r"^\s*bind \S+ ssl crt \S+(.*)$", cfg, re.M)
        if not tls or "alpn h2,http/1.1" not in tls.group(1):
            errors.append(f"{rel}: the TLS listener must offer HTTP/2 (alpn h2,http/1.1)")

    # The template is haproxy.cfg with addresses from the environment, less stats.
    cfg = read("deploy/haproxy/haproxy.cfg")
    cfg = cfg[cfg.index("global\n"):].split("\nfrontend stats\n", 1)[0].rstrip()
    tmpl = read("deploy/haproxy/haproxy.cfg.tmpl")
    tmpl = tmpl[tmpl.index("global\n"):].rstrip()
    # The TLS listener is optional in the template (`.if defined(TLS_PORT)`).
    tmpl = re.sub(r"^\.(if defined\(TLS_PORT\)|endif)\n", "", tmpl, flags=re.M)
    for var, value in (('"127.0.0.1:${FRONT_PORT}"', ":8000"), ('"127.0.0.1:${TLS_PORT}"', ":8443"),
                       ('"${TLS_CRT}"', "/etc/haproxy/certs/pollbox.pem"), ('"${NODE1}"', "127.0.0.1:8081"),
                       ('"${NODE2}"', "127.0.0.1:8082")):
        tmpl = tmpl.replace(var, value)
    if tmpl != cfg:
        errors.append("deploy/haproxy/haproxy.cfg.tmpl has drifted from haproxy.cfg (beyond addresses and stats)")

    unit = read("deploy/systemd/pollbox.service")
    m = re.search(r"^TimeoutStopSec=(\d+)", unit, re.M)
    if not m or int(m.group(1)) <= max_wait_s:
        errors.append("pollbox.service: TimeoutStopSec must exceed max_wait_ms")
    sts = read("deploy/k8s/statefulset.yaml")
    m = re.search(r"terminationGracePeriodSeconds: (\d+)", sts)
    if not m or int(m.group(1)) <= max_wait_s:
        errors.append("statefulset.yaml: terminationGracePeriodSeconds must exceed max_wait_ms")

    # Manifests that name each other.
    svc = read("deploy/k8s/service-headless.yaml")
    checks = [
        ("serviceName: pollbox" in sts and re.search(r"^  name: pollbox$", svc, re.M) is not None,
         "StatefulSet serviceName must be the headless Service's name (pollbox)"),
        ("clusterIP: None" in svc, "service-headless.yaml must be headless (clusterIP: None)"),
        ("name: pollbox-config" in sts and "name: pollbox-config" in read("deploy/k8s/configmap.yaml"),
         "StatefulSet must mount the ConfigMap pollbox-config"),
        ("mountPath: /var/lib/pollbox" in sts, "the data volume must be mounted where the snapshot path points"),
        ("path: /readyz" in sts and "path: /healthz" in sts, "probes must use /readyz and /healthz"),
        ("readOnlyRootFilesystem: true" in sts and "runAsNonRoot: true" in sts, "pod must run non-root, read-only"),
    ]
    errors += [msg for ok, msg in checks if not ok]

    errors += check_k8s_haproxy(max_wait_s)
    errors += check_replicas(prod, max_wait_s)

    # The builder image must carry the pinned toolchain.
    pin = re.search(r'channel = "([^"]+)"', read("rust-toolchain.toml"))
    arg = re.search(r"^ARG RUST_VERSION=(\S+)", read("deploy/docker/Dockerfile"), re.M)
    if not pin or not arg or pin.group(1) != arg.group(1):
        errors.append("deploy/docker/Dockerfile RUST_VERSION differs from rust-toolchain.toml's channel")
    return errors, "configs agree (ConfigMap = systemd TOML + [auth.jwt], template = haproxy.cfg), timeouts cover max_wait_ms, manifests cross-reference"


def deploy_files(*exts):
    """Files under deploy/ with one of these extensions, relative to the root."""
    out = []
    for d, _, files in os.walk(DEPLOY):
        for f in sorted(files):
            if f.endswith(exts):
                out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def pollbox_configs():
    """Every pollbox config deploy/ ships: TOML files and ConfigMaps' pollbox.toml."""
    configs = {}
    for rel in deploy_files(".toml"):
        configs[rel] = read(rel)
    for rel in deploy_files(".yaml", ".yml"):
        for kind, doc in yaml_docs(read(rel)):
            if kind == "ConfigMap" and configmap_toml(doc) is not None:
                configs[rel] = configmap_toml(doc)
    return configs


def port_of(addr):
    m = re.fullmatch(r"(?:\[[^\]]*\]|[^:]*):(\d+)", addr or "")
    return int(m.group(1)) if m else None


def haproxy_sections(cfg, kind):
    """(name, body) of each `frontend`/`backend`/`listen` section of kind."""
    out = []
    for m in re.finditer(rf"^{kind} (\S+)\n((?:(?![a-z]).*\n?)*)", cfg, re.M):
        out.append((m.group(1), m.group(2)))
    return out


def jwks_errors(rel, text):
    """The example JWKS: a key set of public keys only (none that can sign)."""
    try:
        keys = json.loads(text)["keys"]
    except (ValueError, KeyError, TypeError) as e:
        return [f"{rel}: jwks.json is not a JWKS ({e})"]
    errors = [] if keys else [f"{rel}: jwks.json holds no key"]
    for k in keys:
        private = sorted(set(k) & {"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
        if k.get("kty") not in ("OKP", "EC", "RSA") or private:
            errors.append(f"{rel}: key {k.get('kid')!r} can sign tokens (kty {k.get('kty')!r}, {private}): "
                          "ship public keys only")
    return errors


def check_closed():
    """deploy/ is closed by default: /metrics only on metrics_listen, a port no
    Service, Ingress or HAProxy frontend exposes and Prometheus scrapes directly;
    HAProxy refuses /metrics itself; the JWKS comes from a Secret."""
    errors = []
    # 1. Every config serves /metrics on its own port, one port for all.
    ports = set()
    configs = pollbox_configs()
    for rel, toml in configs.items():
        mport = port_of(toml_value(toml, "server", "metrics_listen"))
        if mport is None:
            errors.append(f"{rel}: server.metrics_listen must be set (/metrics off the client port)")
        elif mport == port_of(toml_value(toml, "server", "listen")):
            errors.append(f"{rel}: metrics_listen must be another port than listen")
        else:
            ports.add(mport)
    if len(ports) != 1:
        return errors + [f"deploy/ configs must agree on one metrics port, found {sorted(ports)}"], ""
    mport = ports.pop()

    # 2. Kubernetes: no Service or Ingress reaches it; the pods name it and
    # Prometheus scrapes it; the JWKS is a Secret mounted as a directory.
    keys_files = {toml_value(t, "auth.jwt", "keys_file") for rel, t in configs.items() if "k8s" in rel}
    keys_file = keys_files.pop() if len(keys_files) == 1 else None
    if not keys_file:
        errors.append(f"deploy/k8s ConfigMaps must all set one [auth.jwt] keys_file, found {sorted(map(str, keys_files))}")
    secrets = {}
    for rel in deploy_files(".yaml", ".yml"):
        if not rel.startswith("deploy/k8s/"):
            continue
        for kind, doc in yaml_docs(read(rel)):
            m = re.search(r"^  name: (\S+)$", doc, re.M)
            name = m.group(1) if m else "?"
            if kind == "Service":
                for port in re.findall(r"^\s+(?:- )?(?:port|targetPort|nodePort): (\S+)$", doc, re.M):
                    if port in (str(mport), "metrics"):
                        errors.append(f"{rel}: Service {name} exposes the metrics port ({port})")
            elif kind == "Ingress":
                for port in re.findall(r"port:\n\s+(?:number|name): (\S+)", doc):
                    if port in (str(mport), "metrics"):
                        errors.append(f"{rel}: Ingress {name} routes to the metrics port ({port})")
            elif kind == "Secret":
                secrets[name] = (rel, doc)
            elif kind == "StatefulSet":
                ports_ = dict(re.findall(r"- name: (\w+)\n\s+containerPort: (\d+)", doc))
                if ports_.get("metrics") != str(mport):
                    errors.append(f"{rel}: containerPort metrics must be metrics_listen's port {mport}")
                if re.search(r'prometheus.io/port: "(\d+)"', doc) is None or \
                        re.search(r'prometheus.io/port: "(\d+)"', doc).group(1) != str(mport):
                    errors.append(f"{rel}: annotation prometheus.io/port must be the metrics port {mport}")
                if re.search(r"(?:Probe):\n\s+httpGet:\n\s+path: \S+\n\s+port: (?:metrics|%d)\b" % mport, doc):
                    errors.append(f"{rel}: probes must not use the metrics port (it serves /metrics only)")
                vol = re.search(r"- name: (\S+)\n\s+secret:\n\s+secretName: pollbox-jwks\n", doc)
                mnt = re.search(rf"- name: {vol.group(1)}\n\s+mountPath: (\S+)\n((?:\s+(?:readOnly|subPath).*\n)*)",
                                doc) if vol else None
                if not keys_file or not mnt or mnt.group(1).rstrip("/") != os.path.dirname(keys_file) \
                        or "readOnly: true" not in mnt.group(2) or "subPath" in mnt.group(2):
                    errors.append(f"{rel}: must mount the Secret pollbox-jwks read-only, as a directory (no subPath: "
                                  f"it would never see an update), at {os.path.dirname(keys_file) if keys_file else '?'}")
    if "pollbox-jwks" not in secrets:
        errors.append("deploy/k8s: no Secret pollbox-jwks (the JWKS [auth.jwt] keys_file names)")
    else:
        rel, doc = secrets["pollbox-jwks"]
        key = os.path.basename(keys_file or "")
        m = re.search(rf"^stringData:\n  {re.escape(key)}: \|\n((?:    .*\n|\n)+)", doc, re.M)
        if not m:
            errors.append(f"{rel}: Secret pollbox-jwks must hold {key} in stringData")
        else:
            errors += jwks_errors(rel, "\n".join(line[4:] for line in m.group(1).splitlines()))
        if os.path.dirname(rel) == "deploy/k8s":
            errors.append(f"{rel}: keep the Secret out of deploy/k8s/*.yaml, or `kubectl apply -f deploy/k8s/` "
                          "resets the keys to the example")
    prom = read("deploy/prometheus/prometheus-k8s.yml")
    job = prom.split("job_name: pollbox-k8s", 1)[1].split("job_name:", 1)[0] if "job_name: pollbox-k8s" in prom else ""
    if "__meta_kubernetes_pod_annotation_prometheus_io_port" not in job:
        errors.append("prometheus-k8s.yml: job pollbox-k8s must scrape the port of prometheus.io/port")

    # 3. Static scrape targets are metrics ports.
    prom = read("deploy/prometheus/prometheus.yml")
    job = prom.split("job_name: pollbox\n", 1)[1].split("job_name:", 1)[0] if "job_name: pollbox\n" in prom else ""
    targets = re.findall(r"^\s+- (\S+:\d+)$", job, re.M)
    if not targets or any(port_of(t) != mport for t in targets):
        errors.append(f"prometheus.yml: job pollbox must scrape the nodes' metrics port {mport}, not {targets}")

    # 4. HAProxy: every client frontend refuses /metrics, no server line names
    # the metrics port.
    for rel in deploy_files(".cfg", ".tmpl"):
        if not rel.startswith("deploy/haproxy/"):
            continue
        cfg = read(rel)
        for name, body in haproxy_sections(cfg, "frontend"):
            if name == "stats":
                continue
            if not re.search(r"^\s*http-request deny\b.*\bif \{ path -m beg /metrics \} \|\| "
                             r"\{ path,url_dec -m beg /metrics \}", body, re.M):
                errors.append(f"{rel}: frontend {name} must deny /metrics "
                              "(`http-request deny ... if { path -m beg /metrics } || { path,url_dec -m beg /metrics }`)")
        for line in re.findall(r"^[ \t]*server .*$", cfg, re.M):
            if re.search(rf":{mport}\b", line):
                errors.append(f"{rel}: a server line names the metrics port: {line.strip()}")

    # 5. The image does not advertise it (`docker run -P` would publish it).
    for exposed in re.findall(r"^EXPOSE (.+)$", read("deploy/docker/Dockerfile"), re.M):
        if str(mport) in re.split(r"[\s/]+", exposed):
            errors.append(f"deploy/docker/Dockerfile: EXPOSE {exposed} publishes the metrics port with -P")
    return errors, (f"closed: {len(configs)} configs serve /metrics on :{mport} only; no Service, Ingress, "
                    "HAProxy server or EXPOSE names it; every HAProxy client frontend denies /metrics; "
                    "Prometheus scrapes :%d; the JWKS is the Secret pollbox-jwks (public keys), mounted read-only" % mport)


def check_routing_retries(rel, routing):
    """Retries in a routing backend: on the key's node only, and past a failed
    connection only for GETs that are not long-polls."""
    errors = []
    retry_on = re.search(r"^\s*retry-on (.+)$", routing, re.M)
    l7 = set(retry_on.group(1).split("#")[0].split()) - {"conn-failure", "none"} if retry_on else set()
    if l7:
        if not re.search(r"^\s*http-request disable-l7-retry unless METH_GET\b", routing, re.M):
            errors.append(f"{rel}: backend pollbox: L7 retries must be limited to GET/HEAD (an ingest may have been applied)")
        if not re.search(r"^\s*http-request disable-l7-retry if \{ url_param\(wait_ms\) -m found \}", routing, re.M):
            errors.append(f"{rel}: backend pollbox: long-polls must not be L7-retried (a buffer each while parked)")
        if l7 - {"empty-response"}:
            errors.append(f"{rel}: backend pollbox: retry-on {' '.join(sorted(l7 - {'empty-response'}))}: "
                          "a 503 or timeout retried on the same node only repeats (a long-poll would wait twice)")
    if re.search(r"^\s*option redispatch", routing, re.M):
        errors.append(f"{rel}: backend pollbox must not redispatch (it breaks consistent-hash persistence)")
    return errors


def yaml_docs(text):
    """The documents of a multi-document YAML file, each as (kind, text)."""
    docs = []
    for doc in re.split(r"^---\s*$", text, flags=re.M):
        m = re.search(r"^kind: (\w+)", doc, re.M)
        if m:
            docs.append((m.group(1), doc))
    return docs


def yaml_labels(doc, key):
    """The `key:` mapping of labels (labels, matchLabels, selector) first found in doc."""
    m = re.search(rf"^(\s*){key}:\n((?:\1  \S.*\n)+)", doc, re.M)
    return dict(re.findall(r"^\s*([\w./-]+): (\S+)$", m.group(2), re.M)) if m else {}


def check_k8s_haproxy(max_wait_s):
    """deploy/k8s/haproxy.yaml and ingress/ingress.yaml against haproxy-k8s.cfg."""
    errors = []
    rel = "deploy/k8s/haproxy.yaml"
    cfg = read("deploy/haproxy/haproxy-k8s.cfg")
    docs = dict(yaml_docs(read(rel)))
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        if kind not in docs:
            errors.append(f"{rel}: no {kind}")
    if errors:
        return errors
    dep, svc, pdb = docs["Deployment"], docs["Service"], docs["PodDisruptionBudget"]
    svc_name = re.search(r"^  name: (\S+)$", svc, re.M).group(1)

    m = re.search(r"^  replicas: (\d+)$", dep, re.M)
    if not m or int(m.group(1)) < 2:
        errors.append(f"{rel}: the HAProxy Deployment needs 2 or more replicas")
    m = re.search(r"^\s*image: haproxy:(\d+)\.(\d+)", dep, re.M)
    if not m or (int(m.group(1)), int(m.group(2))) < (2, 6):
        errors.append(f"{rel}: the image must be the official haproxy, 2.6 or newer")

    # Container ports = the listeners of haproxy-k8s.cfg; the Service maps 80/443.
    ports = dict((n, int(p)) for n, p in re.findall(r"- name: (\w+)\n\s+containerPort: (\d+)", dep))
    binds = re.findall(r"^\s*bind :(\d+)(.*)$", cfg, re.M)
    plain = [int(p) for p, rest in binds if "ssl" not in rest]
    tls = [(int(p), rest) for p, rest in binds if "ssl" in rest]
    stats = re.search(r"^frontend stats\n\s*bind :(\d+)", cfg, re.M)
    if not tls or ports.get("https") != tls[0][0]:
        errors.append(f"{rel}: containerPort https must be haproxy-k8s.cfg's TLS bind port")
    if ports.get("http") not in plain or (stats and ports.get("http") == int(stats.group(1))):
        errors.append(f"{rel}: containerPort http must be haproxy-k8s.cfg's client bind port")
    if not stats or ports.get("stats") != int(stats.group(1)):
        errors.append(f"{rel}: containerPort stats must be the stats frontend's bind port")
    svc_ports = re.findall(r"- name: (\w+)\n\s+port: (\d+)\n\s+targetPort: (\w+)", svc)
    if sorted((int(p), t) for _, p, t in svc_ports) != [(80, "http"), (443, "https")]:
        errors.append(f"{rel}: Service {svc_name} must expose 80 -> http and 443 -> https, and no stats port")

    # The config: ConfigMap haproxy-config, key haproxy.cfg, where the image reads it.
    if not re.search(r"configMap:\n\s+name: haproxy-config\n\s+items:\n\s+- key: haproxy.cfg\n\s+path: haproxy.cfg\n", dep) \
            or not re.search(r"- name: config\n\s+mountPath: /usr/local/etc/haproxy\n", dep):
        errors.append(f"{rel}: must mount ConfigMap haproxy-config's key haproxy.cfg as /usr/local/etc/haproxy/haproxy.cfg")
    create = "kubectl create configmap haproxy-config"
    src = "--from-file=haproxy.cfg=deploy/haproxy/haproxy-k8s.cfg"
    for where, text in ((rel, read(rel)), ("deploy/README.md", read("deploy/README.md"))):
        if not re.search(re.escape(create) + r"[^\n]*(\\\n[^\n]*)?" + re.escape(src), text):
            errors.append(f"{where}: must show `{create} ... {src}`")

    # The certificate: Secret pollbox-tls, its two keys, where `crt` points.
    crt = re.search(r"\bssl crt (\S+)", tls[0][1]) if tls else None
    mount = re.search(r"- name: certs\n\s+mountPath: (\S+)\n", dep)
    if not crt or not mount or crt.group(1).rstrip("/") != mount.group(1).rstrip("/"):
        errors.append(f"{rel}: the TLS Secret must be mounted where haproxy-k8s.cfg's `ssl crt` points")
    secret = re.search(r"secret:\n\s+secretName: (\S+)\n((?:\s+.*\n)*)", dep)
    if not secret or secret.group(1) != "pollbox-tls" or \
            sorted(re.findall(r"- key: (\S+)", secret.group(2))) != ["tls.crt", "tls.key"]:
        errors.append(f"{rel}: mount only tls.crt and tls.key of the Secret pollbox-tls (HAProxy loads every file)")
    if not re.search(r"^\s*ssl-load-extra-del-ext\b", cfg, re.M):
        errors.append("haproxy-k8s.cfg: ssl-load-extra-del-ext is needed to find tls.key next to tls.crt")

    # Every "${VAR}" of the config comes from the Deployment's environment.
    env = set(re.findall(r"- name: (\w+)\n\s+value(?:From)?:", dep))
    code = "\n".join(line.split("#", 1)[0] for line in cfg.splitlines())
    for var in sorted(set(re.findall(r"\$\{(\w+)\}", code)) - env):
        errors.append(f"{rel}: haproxy-k8s.cfg uses ${{{var}}}, which the Deployment does not set")
    if not re.search(r"- name: POLLBOX_NAMESPACE\n\s+valueFrom:\n\s+fieldRef:\n\s+fieldPath: metadata.namespace", dep):
        errors.append(f"{rel}: POLLBOX_NAMESPACE must come from metadata.namespace")

    # Probes: HAProxy's own monitor-uri on the client port.
    monitor = re.search(r"^\s*monitor-uri (\S+)", cfg, re.M)
    probes = re.findall(r"(readinessProbe|livenessProbe):\n\s+httpGet:\n\s+path: (\S+)\n\s+port: (\w+)", dep)
    if not monitor or sorted(k for k, _, _ in probes) != ["livenessProbe", "readinessProbe"] or \
            any((path, port) != (monitor.group(1), "http") for _, path, port in probes):
        errors.append(f"{rel}: readiness and liveness must probe haproxy-k8s.cfg's monitor-uri on port http")

    # Stopping: preStop pause + hard-stop-after fit the grace period, which lets
    # long-polls finish.
    grace = re.search(r"terminationGracePeriodSeconds: (\d+)", dep)
    hard = re.search(r"^\s*hard-stop-after (\S+)", cfg, re.M)
    pause = re.search(r'command: \["sleep", "(\d+)"\]', dep)
    hard_s = duration_s(hard.group(1)) if hard else None
    if not grace or hard_s is None or hard_s <= max_wait_s or \
            int(grace.group(1)) <= hard_s + (int(pause.group(1)) if pause else 0):
        errors.append(f"{rel}: need max_wait_ms < hard-stop-after, and hard-stop-after + preStop < terminationGracePeriodSeconds")

    # Labels: Service and PDB select the pods; the pods are not pollbox nodes.
    pod = yaml_labels(dep.split("template:", 1)[1], "labels")
    for what, sel in (("Deployment selector", yaml_labels(dep, "matchLabels")),
                      (f"Service {svc_name}", yaml_labels(svc, "selector")),
                      ("PodDisruptionBudget", yaml_labels(pdb, "matchLabels"))):
        if not sel or any(pod.get(k) != v for k, v in sel.items()):
            errors.append(f"{rel}: the {what} does not select the HAProxy pods")
    if pod.get("app.kubernetes.io/name") == "pollbox":
        errors.append(f"{rel}: HAProxy pods must not be app.kubernetes.io/name=pollbox (Services and scrapes of the nodes)")
    for line in ("runAsNonRoot: true", "readOnlyRootFilesystem: true", "allowPrivilegeEscalation: false"):
        if line not in dep:
            errors.append(f"{rel}: {line} missing")

    # Prometheus scrapes each HAProxy pod by these labels and the port named stats.
    prom = read("deploy/prometheus/prometheus-k8s.yml")
    job = prom.split("job_name: haproxy", 1)[1] if "job_name: haproxy" in prom else ""
    want = f"regex: {pod.get('app.kubernetes.io/name')};{pod.get('app.kubernetes.io/part-of')};stats"
    if want not in job:
        errors.append(f"prometheus-k8s.yml: job haproxy must keep pods with `{want}` (haproxy.yaml's labels and port)")

    # The Ingress example: to HAProxy's Service, streaming, timeouts above HAProxy's.
    irel = "deploy/k8s/ingress/ingress.yaml"
    ing = read(irel)
    backend = re.search(r"service:\n\s+name: (\S+)\n\s+port:\n\s+name: (\S+)", ing)
    if not backend or backend.group(1) != svc_name or backend.group(2) not in {n for n, _, _ in svc_ports}:
        errors.append(f"{irel}: the backend must be Service {svc_name}, by one of its port names")
    if 'nginx.ingress.kubernetes.io/proxy-buffering: "off"' not in ing:
        errors.append(f"{irel}: proxy-buffering must be off (event streams)")
    server_s = duration_s(re.search(r"^\s*timeout server (\S+)", cfg, re.M).group(1))
    for t in ("proxy-read-timeout", "proxy-send-timeout"):
        m = re.search(rf'nginx.ingress.kubernetes.io/{t}: "(\d+)"', ing)
        if not m or int(m.group(1)) <= max(max_wait_s, server_s):
            errors.append(f"{irel}: {t} must exceed max_wait_ms and HAProxy's timeout server")
    if re.search(r"^[^#\n]*upstream-hash-by", ing, re.M):
        errors.append(f"{irel}: no upstream-hash-by: HAProxy hashes; nginx would hash by pod IP")
    if "secretName: pollbox-tls" not in ing:
        errors.append(f"{irel}: the TLS secret must be pollbox-tls (the certificate HAProxy serves too)")
    return errors


def check_replicas(prod, max_wait_s):
    """Replicas of a Kafka log: deploy/k8s/replicas/ and haproxy-replicas.cfg.tmpl."""
    errors = []
    rel = "deploy/k8s/replicas/configmap.yaml"
    rep = configmap_toml(read(rel))
    if rep is None:
        return [f"{rel} has no `pollbox.toml: |` block"]
    # The production config, then a [log] section: nothing else may drift.
    base, _, log = rep[rep.index("[server]"):].partition("\n[log]\n")
    base, jwt = split_jwt(base)
    # A replica keeps no write-ahead file (the log is what keeps its messages):
    # the production config's [wal] section is left out of the comparison.
    prod = re.sub(r"\n\[wal\]\n.*?(?=\n\[|\Z)", "\n", prod, flags=re.S)
    if base.rstrip() != prod[prod.index("[server]"):].rstrip():
        errors.append(f"{rel}: everything before [auth.jwt] must equal deploy/systemd/pollbox.toml from [server] on")
    cm = configmap_toml(read("deploy/k8s/configmap.yaml")) or ""
    if not jwt or jwt.rstrip() != split_jwt(cm)[1].rstrip():
        errors.append(f"{rel}: [auth.jwt], before [log], must equal deploy/k8s/configmap.yaml's")
    if not (toml_value(rep, "log", "brokers") or "").strip():
        errors.append(f"{rel}: [log] brokers must be set (a replica reads a log)")

    cfg = read("deploy/haproxy/haproxy-replicas.cfg.tmpl")
    for which in ("server", "client"):
        m = re.search(rf"^\s*timeout {which} (\S+)", cfg, re.M)
        got = duration_s(m.group(1)) if m else None
        if got is None or got <= max_wait_s:
            errors.append(f"haproxy-replicas.cfg.tmpl: timeout {which} must exceed max_wait_ms ({max_wait_s:g} s)")
    start = re.search(r"^backend pollbox$", cfg, re.M)
    backend = cfg[start.end():].split("\nbackend ", 1)[0] if start else ""
    if not re.search(r"^\s*balance (leastconn|roundrobin)\b", backend, re.M):
        errors.append("haproxy-replicas.cfg.tmpl: backend pollbox must balance by load (leastconn or roundrobin), not by key")
    if "uri /readyz" not in backend or not re.search(r"^\s*default-server\b.*\bcheck\b", backend, re.M):
        errors.append("haproxy-replicas.cfg.tmpl: backend pollbox must health-check /readyz (no traffic while catching up)")
    retry_on = re.search(r"^\s*retry-on (.+)$", backend, re.M)
    if retry_on and set(retry_on.group(1).split()) - {"conn-failure", "none"} and \
            not re.search(r"^\s*http-request disable-l7-retry unless METH_GET\b", backend, re.M):
        errors.append("haproxy-replicas.cfg.tmpl: L7 retries must be limited to GET/HEAD (an ingest may be in the log)")

    sts = read("deploy/k8s/replicas/statefulset.yaml")
    svc = read("deploy/k8s/replicas/service.yaml")
    client_svc = svc.split("\n  name: pollbox-replicas\n", 1)[1].split("\n---", 1)[0] if "\n  name: pollbox-replicas\n" in svc else ""
    checks = [
        ("serviceName: pollbox-replica\n" in sts and re.search(r"^  name: pollbox-replica$", svc, re.M) is not None,
         "replicas: StatefulSet serviceName must be the headless Service pollbox-replica"),
        ("name: pollbox-replica-config" in sts and "name: pollbox-replica-config" in read(rel),
         "replicas: StatefulSet must mount the ConfigMap pollbox-replica-config"),
        ("mountPath: /var/lib/pollbox" in sts, "replicas: the data volume must be mounted where the snapshot path points"),
        ("path: /readyz" in sts and "path: /healthz" in sts, "replicas: probes must use /readyz and /healthz"),
        ("readOnlyRootFilesystem: true" in sts and "runAsNonRoot: true" in sts, "replicas: pod must run non-root, read-only"),
        ("component: replica" in sts and "component: server" not in sts,
         "replicas: pods must carry component: replica (not the standalone Services' server)"),
        (client_svc and "publishNotReadyAddresses" not in client_svc,
         "replicas: the client Service pollbox-replicas must route to Ready pods only"),
    ]
    errors += [msg for ok, msg in checks if not ok]
    m = re.search(r"terminationGracePeriodSeconds: (\d+)", sts)
    if not m or int(m.group(1)) <= max_wait_s:
        errors.append("replicas/statefulset.yaml: terminationGracePeriodSeconds must exceed max_wait_ms")
    return errors


def dashboard():
    with open(os.path.join(DEPLOY, "grafana", "pollbox-dashboard.json"), encoding="utf-8") as f:
        return json.load(f)


def dashboard_queries(d):
    for p in d.get("panels", []):
        for t in p.get("targets", []):
            yield p, t


def check_dashboard():
    errors = []
    d = dashboard()
    if not isinstance(d.get("schemaVersion"), int) or d["schemaVersion"] < 36:
        errors.append("schemaVersion missing or older than 36")
    if not d.get("uid") or not d.get("title"):
        errors.append("dashboard needs a uid and a title")
    ids = [p.get("id") for p in d.get("panels", [])]
    if len(ids) != len(set(ids)) or None in ids:
        errors.append("panel ids must be present and unique")
    cells = set()
    for p in d.get("panels", []):
        g = p.get("gridPos") or {}
        if not all(k in g for k in ("x", "y", "w", "h")) or g["x"] + g["w"] > 24:
            errors.append(f"panel {p.get('title')!r}: bad gridPos {g}")
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    errors.append(f"panel {p.get('title')!r} overlaps another")
                    break
                cells.add((x, y))
        if p.get("type") != "row":
            if not p.get("targets"):
                errors.append(f"panel {p.get('title')!r} has no query")
            for t in p.get("targets", []):
                if not t.get("expr") or not t.get("refId"):
                    errors.append(f"panel {p.get('title')!r}: target without expr or refId")
    names = {v.get("name") for v in d.get("templating", {}).get("list", [])}
    for p, t in dashboard_queries(d):
        for var in re.findall(r"\$(\w+)", t.get("expr", "")):
            if not var.startswith("__") and var not in names:
                errors.append(f"panel {p.get('title')!r} uses undefined variable ${var}")
    titles = " | ".join(p.get("title", "") for p in d.get("panels", []))
    for want in ("Request rate", "Latency", "Ingest", "Boxes", "Memory", "Arena reset", "Epoch overruns", "Connections",
                 "Access refusals", "Per-client limit refusals"):
        if want.lower() not in titles.lower():
            errors.append(f"no panel about {want!r}")
    return errors, f"dashboard JSON: {len(ids)} panels, ids unique, no overlaps, every panel queries"


def used_metrics():
    """Metric names referenced by alerts.yml and the dashboard, mapped to where."""
    used = {}
    name = re.compile(r"\b((?:pollbox|process)_[a-z_]+)\b")
    alerts = read("deploy/prometheus/alerts.yml")
    for line in alerts.splitlines():
        if line.strip().startswith("#"):
            continue
        # Skip annotation prose; only expressions matter.
        if re.match(r"\s*(summary|description):", line):
            continue
        for m in name.findall(line):
            used.setdefault(m, set()).add("alerts.yml")
    for p, t in dashboard_queries(dashboard()):
        for m in name.findall(t["expr"]):
            used.setdefault(m, set()).add("dashboard")
    return used


def base_name(metric):
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in HISTOGRAMS:
            return metric[: -len(suffix)]
    return metric


def check_metrics():
    errors = []
    used = used_metrics()
    for m, where in sorted(used.items()):
        if base_name(m) not in EXPORTED_METRICS:
            errors.append(f"{m} (in {', '.join(sorted(where))}) is not a metric pollbox exports")
    # The log metrics cannot be scraped from a standalone node: find each in the
    # code that renders them, and in the documentation.
    source = read("crates/server/src/metrics/families.rs")
    docs = read("docs/operations.md")
    for m in sorted(LOG_METRICS):
        if f'"{m}"' not in source:
            errors.append(f"{m} is not declared in crates/server/src/metrics/families.rs")
        if f"`{m}" not in docs:
            errors.append(f"{m} is not documented in docs/operations.md")
    rendered = set(re.findall(r'"(pollbox_log_[a-z_]+)', source))
    for m in sorted(rendered - LOG_METRICS):
        errors.append(f"{m} is declared in crates/server/src/metrics/families.rs but not listed in LOG_METRICS")
    return errors, f"{len(used)} metric names in alerts and dashboard, all exported by pollbox"


def write_dashboard_rules(out):
    rules = []
    for p, t in dashboard_queries(dashboard()):
        expr = t["expr"].replace("$__rate_interval", "1m").replace("$__interval", "1m")
        expr = re.sub(r"\$\{?(\w+)\}?", ".*", expr)
        rules.append((f"dashboard:panel{p['id']}_{t['refId']}", expr))
    with open(out, "w", encoding="utf-8") as f:
        f.write("groups:\n  - name: dashboard-queries\n    rules:\n")
        for rec, expr in rules:
            f.write(f"      - record: {rec}\n        expr: {json.dumps(expr)}\n")
    return [], f"{len(rules)} dashboard queries written to {out}"


def check_live(scrape_file):
    with open(scrape_file, encoding="utf-8") as f:
        text = f.read()
    exported = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            exported.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    # A standalone node exports no log metrics (checked against the source by
    # `metrics`); a node of a log must export every one the alerts and dashboard use.
    of_a_log = any(m.startswith("pollbox_log_") for m in exported)
    errors = []
    skipped = 0
    for m, where in sorted(used_metrics().items()):
        if m in exported or any(m + s in exported for s in ("_bucket", "_count")):
            continue
        if base_name(m) in LOG_METRICS and not of_a_log:
            skipped += 1
            continue
        errors.append(f"{m} (in {', '.join(sorted(where))}) is not exported by the running pollbox")
    kind = "a node of a Kafka log" if of_a_log else f"a standalone node; {skipped} log metrics left to the source check"
    return errors, f"all metrics used by alerts and dashboard are exported by pollbox ({len(exported)} series names, {kind})"


def k8s_local(out, metrics_port):
    """deploy/k8s/configmap.yaml's config made runnable here, in directory out:
    metrics_listen on 127.0.0.1:metrics_port, the snapshot in out, and the
    Secret pollbox-jwks's jwks.json laid out as Kubernetes mounts a Secret
    (jwks.json -> ..data/jwks.json, ..data -> a timestamped directory)."""
    toml = configmap_toml(read("deploy/k8s/configmap.yaml"))
    jwks = out + "/jwks"
    os.makedirs(jwks + "/..2026_01_01_00_00_00.1", exist_ok=True)
    doc = dict(yaml_docs(read("deploy/k8s/secret/jwks.yaml")))["Secret"]
    m = re.search(r"^stringData:\n  jwks.json: \|\n((?:    .*\n|\n)+)", doc, re.M)
    if not m:
        return ["deploy/k8s/secret/jwks.yaml: no stringData jwks.json"], ""
    with open(jwks + "/..2026_01_01_00_00_00.1/jwks.json", "w", encoding="utf-8") as f:
        f.write("\n".join(line[4:] for line in m.group(1).splitlines()) + "\n")
    os.symlink("..2026_01_01_00_00_00.1", jwks + "/..data")
    os.symlink("..data/jwks.json", jwks + "/jwks.json")
    subs = [
        (r'^metrics_listen = "[^"]*"', f'metrics_listen = "127.0.0.1:{metrics_port}"'),
        (r'^path = "/var/lib/pollbox/boxes.snapshot"', f'path = "{out}/boxes.snapshot"'),
        (r'^path = "/var/lib/pollbox/wal"', f'path = "{out}/wal"'),
        (r'^keys_file = "[^"]*"', f'keys_file = "{jwks}/jwks.json"'),
    ]
    for pattern, repl in subs:
        toml, n = re.subn(pattern, repl, toml, count=1, flags=re.M)
        if n != 1:
            return [f"deploy/k8s/configmap.yaml: no line matching {pattern!r}"], ""
    with open(out + "/pollbox.toml", "w", encoding="utf-8") as f:
        f.write(toml)
    return [], f"{out}/pollbox.toml: the ConfigMap's config, the Secret's JWKS behind Kubernetes' links"


def probe_closed(port, metrics_port):
    """A node running the Kubernetes config: /metrics on the metrics port only,
    nothing else there, and writes need a token."""
    import urllib.error
    import urllib.request

    def ask(p, path, data=None):
        req = urllib.request.Request(f"http://127.0.0.1:{p}{path}", data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    import time
    for _ in range(100):
        try:
            if ask(port, "/readyz")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    errors = []
    status, _, body = ask(port, "/metrics")
    if status != 404:
        errors.append(f"GET /metrics on the client port: {status}, expected 404")
    status, _, body = ask(metrics_port, "/metrics")
    if status != 200 or "\npollbox_boxes " not in body:
        errors.append(f"GET /metrics on metrics_listen: {status}, expected 200 with pollbox_boxes")
    for path in ("/healthz", "/v1/boxes/x"):
        status, _, _ = ask(metrics_port, path)
        if status != 404:
            errors.append(f"GET {path} on metrics_listen: {status}, expected 404 (it serves /metrics only)")
    status, headers, body = ask(port, "/v1/boxes/deploy-check", b'{"value":1}')
    if status != 401 or not (headers.get("WWW-Authenticate") or "").startswith("Bearer"):
        errors.append(f"POST without a token: {status} {body!r}, expected 401 with WWW-Authenticate: Bearer")
    return errors, ("/metrics 404 on the client port, 200 on metrics_listen (which serves nothing else); "
                    "a write without a token 401")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[1]
    if cmd == "configs":
        errors, ok = check_configs()
    elif cmd == "closed":
        errors, ok = check_closed()
    elif cmd == "dashboard":
        errors, ok = check_dashboard()
    elif cmd == "metrics":
        errors, ok = check_metrics()
    elif cmd == "dashboard-rules" and len(argv) == 3:
        errors, ok = write_dashboard_rules(argv[2])
    elif cmd == "k8s-local" and len(argv) == 4:
        errors, ok = k8s_local(argv[2], int(argv[3]))
    elif cmd == "probe-closed" and len(argv) == 4:
        errors, ok = probe_closed(int(argv[2]), int(argv[3]))
    elif cmd == "live-metrics" and len(argv) == 3:
        errors, ok = check_live(argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print(f"  {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
