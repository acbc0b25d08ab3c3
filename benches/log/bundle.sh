#!/usr/bin/env bash
# benches/log/bundle.sh OUT.tar.xz [POLLBOX_BIN]: everything benches/log/rolling.sh
# needs beside the repository, for a bare x86-64 machine that can fetch nothing
# (the 16-core device of BENCHMARKS.md §1): a Java runtime cut down with jlink to
# the modules Kafka uses, the Kafka jars (stored, not deflated, so xz compresses
# them together; zstd-jni and snappy keep only their linux/amd64 libraries),
# HAProxy and the shared libraries it and pollbox link that a bare image may lack,
# and a stripped pollbox (else cargo build --release -p pollbox). About 40 MB.
#
# benches/log/rolling-device.sh unpacks it and runs rolling.sh on it.
# Needs here: a JDK 17 with jmods (jlink), the Kafka jars (scripts/kafka/install-deps.sh),
# haproxy, zip, unzip, xz.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 OUT.tar.xz [POLLBOX_BIN]" >&2; exit 2; }
OUT="$(realpath -m "$1")"
BIN="${2:-}"
# shellcheck source=../../scripts/kafka/lib.sh
. "$ROOT/scripts/kafka/lib.sh"
LIBS="$(kafka_libs)"
JDK="${BUNDLE_JDK:-$(dirname "$(dirname "$(readlink -f "$(command -v javac || command -v java)")")")}"
[[ -x "$JDK/bin/jlink" && -d "$JDK/jmods" ]] || { echo "bundle.sh: no jlink and jmods under $JDK (set BUNDLE_JDK to a JDK 17)" >&2; exit 1; }
if [[ -z "$BIN" ]]; then
  (cd "$ROOT" && cargo build --release -q -p pollbox)
  BIN="$ROOT/target/release/pollbox"
fi
W="$(mktemp -d /tmp/pollbox-bundle.XXXXXX)"
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/b/bin" "$W/b/lib" "$W/b/kafka/libs"

# The modules the Kafka broker, its tools and log4j reach (jdeps over the jars,
# plus what they load by name: JNDI, SASL/GSSAPI, JMX).
"$JDK/bin/jlink" --add-modules java.base,java.logging,java.management,java.naming,java.security.jgss,java.security.sasl,java.sql,java.xml,java.desktop,java.rmi,jdk.management,jdk.unsupported,jdk.crypto.ec,jdk.security.auth,jdk.security.jgss \
  --strip-debug --no-header-files --no-man-pages --compress=0 --output "$W/b/jre"
strip --strip-unneeded "$W/b/jre/lib/server/libjvm.so"

for j in "$LIBS"/*.jar; do
  name="$(basename "$j")"
  rm -rf "$W/x" && mkdir "$W/x"
  (cd "$W/x" && unzip -q "$j")
  # Native libraries for other systems.
  find "$W/x" \( -name '*.so' -o -name '*.dll' -o -name '*.dylib' -o -name '*.jnilib' -o -name '*.a' \) \
    -not -path '*linux/amd64*' -not -path '*Linux/x86_64*' -delete
  (cd "$W/x" && zip -q -0 -r -X "$W/b/kafka/libs/$name" .)
done
touch "$W/b/kafka/libs/.complete"

cp "$(command -v haproxy)" "$W/b/bin/haproxy"
cp "$BIN" "$W/b/bin/pollbox"
strip "$W/b/bin/pollbox"
for b in "$W/b/bin/haproxy" "$W/b/bin/pollbox"; do ldd "$b" | awk '/=>/ {print $3}'; done | sort -u \
  | grep -v -E '/(libc|libm|ld-linux[^/]*|libgcc_s|libstdc\+\+|libpthread|libdl|librt)\.so' \
  | while read -r l; do cp -L "$l" "$W/b/lib/"; done

tar -C "$W/b" -cf - . | xz -T0 -6 >"$OUT"
echo "bundle.sh: $OUT ($(du -h "$OUT" | cut -f1)), pollbox from $BIN"
