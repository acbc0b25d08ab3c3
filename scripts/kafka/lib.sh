# shellcheck shell=bash
# Sourced by the scripts in this folder; not run on its own.
# Finds (and on first use fetches) the Kafka jars, and runs Kafka classes.

KAFKA_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# pid_runs PID: whether PID runs. A broker killed but not reaped yet (a zombie:
# the brokers are re-parented to PID 1, which may reap late) does not.
pid_runs() {
  local state
  kill -0 "$1" 2>/dev/null || return 1
  state="$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null)"
  [[ "$state" != Z ]]
}

# The version fetched: $KAFKA_VERSION, else the <kafka.version> in pom.xml.
kafka_version() {
  if [[ -n "${KAFKA_VERSION:-}" ]]; then
    echo "$KAFKA_VERSION"
  else
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_SCRIPTS_DIR/pom.xml" | head -n1
  fi
}

# Where the jars are cached (outside the repository).
kafka_home() {
  echo "${POLLBOX_KAFKA_HOME:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/pollbox-kafka/$(kafka_version)}"
}

# Prints the folder holding every jar the broker and its tools need,
# fetching them with Maven first if they are not cached yet.
kafka_libs() {
  local home libs
  home="$(kafka_home)"
  libs="$home/libs"
  if [[ -f "$libs/.complete" ]]; then
    echo "$libs"
    return 0
  fi
  mkdir -p "$home"
  (
    # Several starts at once (parallel tests) fetch only once.
    flock 9
    if [[ ! -f "$libs/.complete" ]]; then
      command -v mvn >/dev/null || { echo "kafka: mvn not found (run scripts/kafka/install-deps.sh)" >&2; exit 1; }
      echo "kafka: fetching Kafka $(kafka_version) jars into $libs" >&2
      rm -rf "$libs.tmp"
      if ! mvn -q -B -f "$KAFKA_SCRIPTS_DIR/pom.xml" -Dkafka.version="$(kafka_version)" \
          dependency:copy-dependencies -DincludeScope=runtime \
          -DoutputDirectory="$libs.tmp" >"$home/mvn.log" 2>&1; then
        echo "kafka: mvn failed; see $home/mvn.log:" >&2
        tail -n 20 "$home/mvn.log" >&2
        exit 1
      fi
      rm -rf "$libs"
      mv "$libs.tmp" "$libs"
      touch "$libs/.complete"
    fi
  ) 9>"$home/.lock" || return 1
  echo "$libs"
}

# The class-data-sharing archive (made by kafka_make_cds) for this JVM build:
# it lets every Kafka JVM here start 1-3 s faster.
kafka_cds_file() {
  local java_home release=""
  java_home="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
  [[ -f "$java_home/release" ]] \
    && release="$(sed -n 's/^JAVA_RUNTIME_VERSION="\(.*\)"$/\1/p' "$java_home/release")"
  echo "$(kafka_home)/kafka-${release:-unknown}.jsa"
}

# JVM options every Kafka JVM here gets: JVM log lines (e.g. a warning about a
# stale archive) go to stderr, never stdout; the archive is used if it exists.
kafka_jvm_common() {
  local jsa
  jsa="$(kafka_cds_file)"
  echo -n "-Xlog:disable -Xlog:all=warning:stderr"
  if [[ -z "${KAFKA_NO_CDS:-}" && -f "$jsa" ]]; then echo -n " -XX:SharedArchiveFile=$jsa"; fi
  echo
}

# Makes the archive once: starts a broker that dumps the classes it loaded at
# exit, and stops it (about 20 s). Called by install-deps.sh.
kafka_make_cds() {
  local jsa home
  jsa="$(kafka_cds_file)"
  home="$(kafka_home)"
  [[ -f "$jsa" ]] && return 0
  kafka_libs >/dev/null || return 1
  (
    flock 9
    [[ -f "$jsa" ]] && exit 0
    rm -f "$jsa.tmp"
    out="$(KAFKA_NO_CDS=1 KAFKA_JVM_OPTS="-XX:ArchiveClassesAtExit=$jsa.tmp" \
      "$KAFKA_SCRIPTS_DIR/start.sh")" || exit 1
    dir="$(sed -n 's/^DIR=//p' <<<"$out")"
    KAFKA_STOP_TIMEOUT=120 "$KAFKA_SCRIPTS_DIR/stop.sh" "$dir"
    [[ -s "$jsa.tmp" ]] || { echo "kafka: no class-data archive was written" >&2; exit 1; }
    mv "$jsa.tmp" "$jsa"
  ) 9>"$home/.cds.lock"
}

# kafka_run CLASS ARGS...: runs a Kafka main class (a tool) in the foreground.
kafka_run() {
  local libs
  libs="$(kafka_libs)" || return 1
  local class="$1"
  shift
  # Tools are short-lived: a small heap, C1 only, and log4j warnings on stderr.
  # shellcheck disable=SC2046,SC2086
  java ${KAFKA_TOOL_OPTS:--Xmx256m -XX:TieredStopAtLevel=1} $(kafka_jvm_common) \
    -Dlog4j2.configurationFile="$KAFKA_SCRIPTS_DIR/log4j2-tools.properties" \
    -cp "$libs/*" "$class" "$@"
}
