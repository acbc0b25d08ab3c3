#!/usr/bin/env bash
# What CI (and a fresh machine) runs before the Kafka tests: installs Java 17
# and Maven from Debian if missing, fetches the Kafka jars into the cache, and
# makes the class-data archive that speeds up every Kafka JVM start.
# Idempotent; about 0.1 s when everything is there already.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! command -v java >/dev/null || ! command -v mvn >/dev/null || ! command -v python3 >/dev/null; then
  echo "kafka: installing openjdk-17-jre-headless, maven, python3" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven python3 >/dev/null
fi
kafka_libs >/dev/null
if [[ ! -f "$(kafka_cds_file)" ]]; then
  echo "kafka: making the class-data archive (one broker start and stop)" >&2
  kafka_make_cds || echo "kafka: could not make the archive; brokers will start a bit slower" >&2
fi
