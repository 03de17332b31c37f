# Shared set-up for scripts/demo and scripts/test (sourced, not run).
# Installs what a brand-new machine lacks: Debian packages, a Java for Spark, and the
# virtualenv with the project and its extras. Idempotent: a second run installs nothing.
set -euo pipefail

KT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KT_VENV="${KT_VENV:-$KT_ROOT/.venv}"

kt_log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

# What the set-up fetched or built is trusted only as it was when that step finished: the
# step's last act seals its directory (kt_seal: a SHA-256 of every file in it, written
# last), and a later set-up uses it only if every file still has its checksum (kt_sealed).
# A step cut short, a file changed or lost since: no seal, or one that fails, and the step
# runs again. A directory the user named (KT_KUBERNETES=..., say) is theirs: used as it is.
KT_CACHE="$HOME/.cache/kafkatunnel"
KT_SEAL=.kt-sha256
kt_sealed() {
  case "$1" in "$KT_CACHE"/* | "$KT_VENV"/*) ;; *) [ -e "$1" ]; return ;; esac
  if [ -d "$1" ]; then
    [ -f "$1/$KT_SEAL" ] && (cd "$1" && sha256sum --quiet --strict -c "$KT_SEAL" >/dev/null 2>&1)
  else
    [ -f "$1.sha256" ] && (cd "$(dirname "$1")" && sha256sum --quiet --strict -c "$1.sha256" >/dev/null 2>&1)
  fi
}
# kt_seal PATH [SKIP...]: a directory's files (but those under its SKIP subdirectories,
# which the program rewrites as it runs) or one file, sealed
kt_seal() {
  local path="$1" skip prune=()
  shift
  if [ -d "$path" ]; then
    for skip in "$@"; do prune+=(-path "./$skip" -prune -o); done
    (cd "$path" && find . "${prune[@]}" -type f ! -name "$KT_SEAL" ! -name "$KT_SEAL.partial" -print0 | sort -z |
      xargs -0 -r sha256sum >"$KT_SEAL.partial" && mv "$KT_SEAL.partial" "$KT_SEAL")
  else
    (cd "$(dirname "$path")" && sha256sum "$(basename "$path")" >"$path.sha256.partial" &&
      mv "$path.sha256.partial" "$path.sha256")
  fi
}

# apt-get as root, waiting up to 5 minutes for the package database when another apt-get
# (a machine's first-boot updates, say) holds its lock, instead of failing at once.
# `apt-get update` ignores that option (apt 2.6), so it is retried while the lock is held.
kt_apt() {
  kt_as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "$@"
}
kt_apt_update() {
  local deadline=$((SECONDS + 300)) out
  until out="$(kt_apt update -qq 2>&1)"; do
    if [[ "$out" != *"Could not get lock"* ]] || [ "$SECONDS" -ge "$deadline" ]; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    sleep 2
  done
}

kt_as_root() {
  if [ "$(id -u)" = 0 ]; then "$@";
  elif command -v sudo >/dev/null 2>&1; then sudo "$@";
  else return 1; fi
}

# Debian packages: command -> package.
KT_APT_COMMANDS=(
  socat:socat kcat:kcat ip:iproute2 tmux:tmux openssl:openssl getent:libc-bin
  tshark:tshark mergecap:wireshark-common tcpdump:tcpdump          # captures
  dig:bind9-dnsutils unbound:unbound dnsmasq:dnsmasq-base          # resolvers before the shim
  dbus-daemon:dbus                                                 # a bus for systemd-resolved
  nft:nftables                                                     # relays on addresses of their own
)
# The tests' own, beside those: kt_apt_packages "${KT_APT_TEST_COMMANDS[@]}"
KT_APT_TEST_COMMANDS=(
  ssh:openssh-client                                               # --exec templates, for real
  javac:openjdk-17-jdk-headless                                    # re-derives the JDK's hashes
  fish:fish                                                        # reads `kafkatunnel env --format fish`
)
kt_apt_packages() {
  local missing=() pair
  for pair in "${KT_APT_COMMANDS[@]}" "$@"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  if ! kt_java_ok; then missing+=(openjdk-17-jre-headless); fi
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    kt_log "missing ${missing[*]} and no apt-get here: install them with your package manager"
    return 0
  fi
  kt_log "installing Debian packages: ${missing[*]}"
  kt_apt_update
  kt_apt install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# Spark needs Java 17 or newer.
kt_java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local major
  major="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
  [ -n "$major" ] && [ "${major%%.*}" -ge 17 ]
}

kt_check_java() {
  if kt_java_ok; then return 0; fi
  kt_log "Java 17 or newer is required by Spark (kafkatunnel verify) and was not found."
  kt_log "Install it: apt-get install openjdk-17-jre-headless (or set JAVA_HOME)."
  return 1
}

# A Debian package unpacked next to the virtualenv for the tests, never installed:
#   kt_unpack_for_tests PACKAGE FILE-IT-SHIPS
kt_unpack_for_tests() {
  local package="$1" target="$KT_VENV/opt/$1" work
  if kt_sealed "$target" && [ -x "$target/$2" ]; then return 0; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    kt_log "no apt-get: the tests that need $package will say what they miss"
    return 0
  fi
  kt_log "unpacking $package (for the tests) into $target"
  work="$(mktemp -d)" && chmod 755 "$work"
  if ! (cd "$work" && apt-get download -q "$package" >/dev/null 2>&1); then
    kt_apt_update  # no package lists yet
    (cd "$work" && apt-get download -q "$package" >/dev/null)
  fi
  rm -rf "$target.partial" && mkdir -p "$target.partial"
  dpkg -x "$work/${package}"_*.deb "$target.partial"
  kt_seal "$target.partial"
  rm -rf "$work" "$target" && mv "$target.partial" "$target"
}

# systemd-resolved: installed, the package would take over this machine's
# /etc/resolv.conf. The tests run it in a network and mount namespace of its own, with a
# D-Bus of its own.
kt_resolved_for_tests() { kt_unpack_for_tests systemd-resolved lib/systemd/systemd-resolved; }

# Debian's kubectl (kubernetes-client, 1.20): the oldest real kubectl the tests drive,
# beside whatever newer ones the machine has; unpacked, so it never shadows the user's own.
kt_kubectl_for_tests() { kt_unpack_for_tests kubernetes-client usr/bin/kubectl; }

# The virtualenv, reinstalled only when pyproject.toml changed.
kt_venv() {
  local extras="$1" stamp
  if [ ! -x "$KT_VENV/bin/python" ]; then
    kt_log "creating virtualenv $KT_VENV"
    python3 -m venv "$KT_VENV"
  fi
  stamp="$KT_VENV/.kafkatunnel-installed-$extras"
  if [ ! -f "$stamp" ] || [ "$KT_ROOT/pyproject.toml" -nt "$stamp" ]; then
    kt_log "installing kafkatunnel[$extras] into $KT_VENV"
    "$KT_VENV/bin/python" -m pip install -q --upgrade pip
    "$KT_VENV/bin/python" -m pip install -q -e "$KT_ROOT[$extras]"
    touch "$stamp"
  fi
  export PATH="$KT_VENV/bin:$PATH"
}

# Maven, from Debian when missing: every jar the tests run comes from Maven Central with it.
kt_maven() {
  if command -v mvn >/dev/null 2>&1; then return 0; fi
  kt_log "installing Maven (to fetch jars from Maven Central)"
  kt_apt_update
  kt_apt install -y -qq --no-install-recommends maven >/dev/null
}

# The jars scripts/NAME/pom.xml names, with their dependencies, copied into DIR (a cache
# outside the repository) whole or not at all, sealed: kt_maven_jars WHAT NAME DIR
# [MAVEN-ARG...]. Maven checks each download against Central's checksum (-C: a mismatch
# fails, it does not warn).
# DIR also keeps what it was fetched by (.kt-fetched: the pom's checksum and the Maven
# arguments), so that a pom that changed (a jar added, at the same version) fetches again.
kt_maven_jars() {
  local what="$1" name="$2" dir="$3"
  shift 3
  kt_maven
  kt_log "fetching $what from Maven Central into $dir"
  rm -rf "$dir.partial"
  mvn -q -B -C -f "$KT_ROOT/scripts/$name/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$dir.partial" "$@"
  kt_maven_fetched_by "$name" "$@" >"$dir.partial/.kt-fetched"
  kt_seal "$dir.partial"
  rm -rf "$dir" && mv "$dir.partial" "$dir"
}
kt_maven_fetched_by() {
  local name="$1"
  shift
  (cd "$KT_ROOT/scripts/$name" && sha256sum pom.xml) && printf '%s\n' "$@"
}
# kt_maven_current NAME DIR JAR [MAVEN-ARG...]: DIR holds, sealed, what kt_maven_jars
# fetches for these arguments today (a directory the user named: as it is, if it has JAR)
kt_maven_current() {
  local name="$1" dir="$2" jar="$3"
  shift 3
  kt_sealed "$dir" && [ -f "$dir/$jar" ] || return 1
  case "$dir" in "$KT_CACHE"/*) ;; *) return 0 ;; esac
  [ "$(cat "$dir/.kt-fetched" 2>/dev/null)" = "$(kt_maven_fetched_by "$name" "$@")" ]
}

# Apache Kafka, for `demo --cluster apache` and the tests (kafkatunnel/demo/apache.py): its jars from
# Maven Central with Maven, once, into a cache outside the repository, pinned by the version
# in scripts/apache-kafka/pom.xml. Maven comes from Debian when missing.
KT_KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KT_ROOT/scripts/apache-kafka/pom.xml")"
KT_KAFKA_LIB="${KAFKATUNNEL_KAFKA_LIB:-$HOME/.cache/kafkatunnel/apache-kafka-$KT_KAFKA_VERSION/lib}"
kt_apache_kafka() {
  if kt_maven_current apache-kafka "$KT_KAFKA_LIB" "kafka_2.13-$KT_KAFKA_VERSION.jar"; then return 0; fi
  kt_maven_jars "Apache Kafka $KT_KAFKA_VERSION" apache-kafka "$KT_KAFKA_LIB"
}

# The last Apache Kafka 3.x (<kafka3.version> in the same pom), for the tests' second
# cluster (tests/apache3/): the same pom at that version, into a cache of its own.
KT_KAFKA3_VERSION="$(sed -n 's:.*<kafka3.version>\(.*\)</kafka3.version>.*:\1:p' "$KT_ROOT/scripts/apache-kafka/pom.xml")"
KT_KAFKA3_LIB="$HOME/.cache/kafkatunnel/apache-kafka-$KT_KAFKA3_VERSION/lib"
kt_apache_kafka3() {
  if kt_maven_current apache-kafka "$KT_KAFKA3_LIB" "kafka_2.13-$KT_KAFKA3_VERSION.jar" \
    -Dkafka.version="$KT_KAFKA3_VERSION"; then return 0; fi
  kt_maven_jars "Apache Kafka $KT_KAFKA3_VERSION" apache-kafka "$KT_KAFKA3_LIB" \
    -Dkafka.version="$KT_KAFKA3_VERSION"
}

# Kafka Connect's distributed worker and the FileStream connectors, at the version
# scripts/kafka-connect/pom.xml pins (it says why not Apache Kafka's), from Maven Central into
# a cache of their own.
KT_CONNECT_VERSION="$(sed -n 's:.*<connect.version>\(.*\)</connect.version>.*:\1:p' "$KT_ROOT/scripts/kafka-connect/pom.xml")"
KT_CONNECT_LIB="${KT_CONNECT_LIB:-$HOME/.cache/kafkatunnel/kafka-connect-$KT_CONNECT_VERSION/lib}"
kt_kafka_connect() {
  if kt_maven_current kafka-connect "$KT_CONNECT_LIB" "connect-runtime-$KT_CONNECT_VERSION.jar"; then return 0; fi
  kt_maven_jars "Kafka Connect $KT_CONNECT_VERSION" kafka-connect "$KT_CONNECT_LIB"
}

# Kafka Streams (kafka-streams and its dependencies, RocksDB among them), at Apache Kafka's
# version, from Maven Central into a cache of their own (scripts/kafka-streams/pom.xml), for
# the tests' Streams application (tests/apache/clients/StreamsCounter.java).
KT_STREAMS_LIB="${KT_STREAMS_LIB:-$HOME/.cache/kafkatunnel/kafka-streams-$KT_KAFKA_VERSION/lib}"
kt_kafka_streams() {
  if kt_maven_current kafka-streams "$KT_STREAMS_LIB" "kafka-streams-$KT_KAFKA_VERSION.jar" \
    -Dkafka.version="$KT_KAFKA_VERSION"; then return 0; fi
  kt_maven_jars "Kafka Streams $KT_KAFKA_VERSION" kafka-streams "$KT_STREAMS_LIB" \
    -Dkafka.version="$KT_KAFKA_VERSION"
}

# Keycloak, the identity provider of the tests' OAUTHBEARER listener
# (tests/worlds/keycloak.py): its server distribution from Maven Central with
# Maven, once, unpacked into a cache outside the repository at the version
# scripts/keycloak/pom.xml pins, and built there once for the tests (an in-memory database),
# so that each start is `kc.sh start --optimized`, with no build of its own.
KT_KEYCLOAK_VERSION="$(sed -n 's:.*<keycloak.version>\(.*\)</keycloak.version>.*:\1:p' "$KT_ROOT/scripts/keycloak/pom.xml")"
KT_KEYCLOAK_HOME="${KT_KEYCLOAK_HOME:-$HOME/.cache/kafkatunnel/keycloak-$KT_KEYCLOAK_VERSION}"
kt_keycloak() {
  if kt_sealed "$KT_KEYCLOAK_HOME" && [ -x "$KT_KEYCLOAK_HOME/bin/kc.sh" ]; then return 0; fi
  kt_maven
  kt_log "fetching Keycloak $KT_KEYCLOAK_VERSION from Maven Central into $KT_KEYCLOAK_HOME"
  local partial="$KT_KEYCLOAK_HOME.partial"
  rm -rf "$partial" "$KT_KEYCLOAK_HOME"
  mvn -q -B -C -f "$KT_ROOT/scripts/keycloak/pom.xml" dependency:unpack -Dkt.home="$partial"
  "$partial/keycloak-$KT_KEYCLOAK_VERSION/bin/kc.sh" build --db=dev-mem >/dev/null
  kt_seal "$partial/keycloak-$KT_KEYCLOAK_VERSION" data  # data/: what each start writes
  mv "$partial/keycloak-$KT_KEYCLOAK_VERSION" "$KT_KEYCLOAK_HOME"
  rm -rf "$partial"
}

# Apicurio Registry, the real schema registry of the tests: its release from Maven Central,
# assembled into a runnable server by Quarkus's build (scripts/apicurio-registry/pom.xml says
# why that takes a build, and which release), into a cache outside the repository.
KT_APICURIO_VERSION="$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$KT_ROOT/scripts/apicurio-registry/pom.xml")"
KT_APICURIO_HOME="${KT_APICURIO_HOME:-$HOME/.cache/kafkatunnel/apicurio-registry-$KT_APICURIO_VERSION}"
kt_apicurio_registry() {
  if kt_sealed "$KT_APICURIO_HOME" && [ -f "$KT_APICURIO_HOME/apicurio-registry-runner-1-runner.jar" ]; then return 0; fi
  kt_maven
  kt_log "building Apicurio Registry $KT_APICURIO_VERSION from Maven Central into $KT_APICURIO_HOME"
  local partial="$KT_APICURIO_HOME.partial"
  rm -rf "$partial"
  mvn -q -B -C -f "$KT_ROOT/scripts/apicurio-registry/pom.xml" package -Dkt.build="$partial"
  kt_seal "$partial"
  rm -rf "$KT_APICURIO_HOME" && mv "$partial" "$KT_APICURIO_HOME"
}

# PySpark 3.5, the older line kafkatunnel[verify] allows, for the tests that read object
# storage through its Hadoop (3.3, AWS SDK v1): pip-installed at the version
# scripts/pyspark-3.5/requirements.txt pins, into a cache outside the repository, never on the
# virtualenv's path (a test puts it first on a subprocess's). After kt_venv.
KT_PYSPARK35_VERSION="$(sed -n 's/^pyspark==//p' "$KT_ROOT/scripts/pyspark-3.5/requirements.txt")"
KT_PYSPARK35="${KT_PYSPARK35:-$HOME/.cache/kafkatunnel/pyspark-$KT_PYSPARK35_VERSION}"
kt_pyspark35() {
  if kt_sealed "$KT_PYSPARK35" && [ -f "$KT_PYSPARK35/pyspark/jars/spark-core_2.12-$KT_PYSPARK35_VERSION.jar" ]; then return 0; fi
  kt_log "installing PySpark $KT_PYSPARK35_VERSION (for the tests) into $KT_PYSPARK35"
  rm -rf "$KT_PYSPARK35.partial"
  "$KT_VENV/bin/python" -m pip install -q --no-compile --target "$KT_PYSPARK35.partial" \
    -r "$KT_ROOT/scripts/pyspark-3.5/requirements.txt"
  kt_seal "$KT_PYSPARK35.partial"
  rm -rf "$KT_PYSPARK35" && mv "$KT_PYSPARK35.partial" "$KT_PYSPARK35"
}

# Hadoop's S3A connector for `verify s3a://...` (kafkatunnel/verify/objectstore.py), at the
# version of the Hadoop inside the installed PySpark (the same coordinates verify hands Spark),
# with its AWS SDK bundle, into the local Maven repository (~/.m2), where Spark's own package
# resolution looks before Maven Central (scripts/hadoop-aws/pom.xml). For the virtualenv's
# PySpark and for the tests' PySpark 3.5 (Hadoop 3.3.4, SDK v1). After kt_venv, kt_pyspark35.
# Then Spark's own resolution (Ivy, as `--packages` does) once per PySpark, by spark-submit
# of an empty job, so that its cache (~/.ivy2 for Spark 3, ~/.ivy2.5.2 for Spark 4) holds
# the jars before any test's deadline starts.
kt_hadoop_aws() {
  local where version jar home empty
  for where in "" "$KT_PYSPARK35"; do
    version="$(PYTHONPATH="$where" python -c \
      'from kafkatunnel.verify.objectstore import hadoop_version as v; print(v())')"
    jar="$HOME/.m2/repository/org/apache/hadoop/hadoop-aws/$version/hadoop-aws-$version.jar"
    if [ ! -f "$jar" ]; then
      kt_maven
      kt_log "fetching hadoop-aws $version (with the AWS SDK bundle) from Maven Central"
      mvn -q -B -C -f "$KT_ROOT/scripts/hadoop-aws/pom.xml" dependency:resolve -Dhadoop.version="$version"
    fi
    jar="org.apache.hadoop_hadoop-aws-$version.jar"
    if [ -f "$HOME/.ivy2/jars/$jar" ] || [ -f "$HOME/.ivy2.5.2/jars/$jar" ]; then continue; fi
    home="$(PYTHONPATH="$where" python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
    kt_log "resolving hadoop-aws $version as Spark does (Ivy), for the PySpark in $home"
    empty="$(mktemp --suffix=.py)"
    SPARK_HOME="$home" PYTHONPATH="$where" PYSPARK_PYTHON="$KT_VENV/bin/python" \
      "$home/bin/spark-submit" --packages "org.apache.hadoop:hadoop-aws:$version" "$empty" \
      >"$empty.log" 2>&1 || { cat "$empty.log" >&2; rm -f "$empty" "$empty.log"; return 1; }
    rm -f "$empty" "$empty.log"
  done
}

# Docker for the container tests (tests/docker/): the machine's engine when `docker info`
# answers; otherwise Debian's engine (docker.io, containerd, runc), unpacked beside the
# virtualenv and never installed, which the tests start on a socket of their own and stop.
# The recipes of docs/containers.md run with Debian's docker-compose (Compose 1.29) and the
# devcontainer CLI from npm; their image is a Debian root file system made with debootstrap,
# which the tests import: nothing comes from an image registry.
KT_DOCKER_ENGINE="$KT_VENV/opt/docker-engine"
KT_DEVCONTAINER_CLI="@devcontainers/cli@0.89.0"
KT_DEBIAN_ROOTFS="$HOME/.cache/kafkatunnel/images/debian-minbase.tar"
kt_docker_for_tests() {
  local package work
  kt_apt_packages docker-compose:docker-compose debootstrap:debootstrap
  if ! docker info >/dev/null 2>&1 && ! { kt_sealed "$KT_DOCKER_ENGINE" && [ -x "$KT_DOCKER_ENGINE/usr/sbin/dockerd" ]; }; then
    kt_log "unpacking Debian's Docker Engine (for the tests) into $KT_DOCKER_ENGINE"
    work="$(mktemp -d)" && chmod 755 "$work"
    if ! (cd "$work" && apt-get download -q docker.io containerd runc tini >/dev/null 2>&1); then
      kt_apt_update  # no package lists yet
      (cd "$work" && apt-get download -q docker.io containerd runc tini >/dev/null)
    fi
    rm -rf "$KT_DOCKER_ENGINE.partial" && mkdir -p "$KT_DOCKER_ENGINE.partial"
    for package in "$work"/*.deb; do dpkg -x "$package" "$KT_DOCKER_ENGINE.partial"; done
    kt_seal "$KT_DOCKER_ENGINE.partial"
    rm -rf "$work" "$KT_DOCKER_ENGINE" && mv "$KT_DOCKER_ENGINE.partial" "$KT_DOCKER_ENGINE"
  fi
  if command -v npm >/dev/null 2>&1; then
    work="$HOME/.cache/kafkatunnel/devcontainers-cli-${KT_DEVCONTAINER_CLI##*@}"
    if ! { kt_sealed "$work" && [ -x "$work/node_modules/.bin/devcontainer" ]; }; then
      kt_log "installing $KT_DEVCONTAINER_CLI into $work"
      rm -rf "$work.partial" && mkdir -p "$work.partial"
      (cd "$work.partial" && npm install --no-audit --no-fund --loglevel=error \
        "$KT_DEVCONTAINER_CLI" >/dev/null)
      kt_seal "$work.partial"
      rm -rf "$work" && mv "$work.partial" "$work"
    fi
  fi
  if ! kt_sealed "$KT_DEBIAN_ROOTFS" && [ "$(id -u)" = 0 ]; then
    kt_log "making a Debian root file system with debootstrap into $KT_DEBIAN_ROOTFS"
    work="$(mktemp -d)"
    /usr/sbin/debootstrap --variant=minbase "$(. /etc/os-release && echo "$VERSION_CODENAME")" \
      "$work/root" http://deb.debian.org/debian >/dev/null
    mkdir -p "$(dirname "$KT_DEBIAN_ROOTFS")"
    tar -C "$work/root" -cf "$KT_DEBIAN_ROOTFS.partial" .
    mv "$KT_DEBIAN_ROOTFS.partial" "$KT_DEBIAN_ROOTFS"
    kt_seal "$KT_DEBIAN_ROOTFS"
    rm -rf "$work"
  fi
}

# The clients in other languages that the tests run through the tunnel: franz-go from the Go
# module proxy (go.sum pins it), built here (a build on an empty Go cache takes minutes)
# into a cache named by the Go client's sources' hash; kafkajs and @platformatic/kafka from
# npm (package-lock.json pins them) into a cache outside the repository named by the lock
# file's hash. The Java client is kafka-clients, among Apache Kafka's jars above.
kt_client_libraries() {
  local clients="$KT_ROOT/tests/apache/clients" hash target
  if command -v go >/dev/null 2>&1; then
    hash="$(cat "$clients/go/go.mod" "$clients/go/go.sum" "$clients/go/main.go" | sha256sum | cut -c1-12)"
    target="$HOME/.cache/kafkatunnel/go-client-$hash"
    if ! { kt_sealed "$target" && [ -x "$target/client" ]; }; then
      kt_log "building the Go client (franz-go) into $target"
      rm -rf "$target.partial" && mkdir -p "$target.partial"
      (cd "$clients/go" && go build -mod=readonly -o "$target.partial/client" .)
      kt_seal "$target.partial"
      rm -rf "$target" && mv "$target.partial" "$target"
    fi
  else
    kt_log "no Go toolchain: the Go client's tests will say so"
  fi
  if ! command -v npm >/dev/null 2>&1; then
    kt_log "no npm: the JavaScript clients' tests will say so"
    return 0
  fi
  hash="$(sha256sum "$clients/js/package-lock.json" | cut -c1-12)"
  target="$HOME/.cache/kafkatunnel/js-clients-$hash"
  if kt_sealed "$target" && [ -d "$target/node_modules" ]; then return 0; fi
  kt_log "installing the JavaScript clients into $target"
  rm -rf "$target.partial" && mkdir -p "$target.partial"
  cp "$clients/js/package.json" "$clients/js/package-lock.json" "$target.partial/"
  (cd "$target.partial" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  kt_seal "$target.partial"
  rm -rf "$target" && mv "$target.partial" "$target"
}

# A real one-node Kubernetes for the tests (tests/worlds/kubernetes.py):
# kube-apiserver, the kubelet and kubectl (the newest kubectl the tests drive) built once from the Go module proxy at the release
# scripts/kubernetes/go.mod pins (nothing of Kubernetes is in this repository), with that
# release stamped in as their version, into a cache outside the repository; Go's own caches
# beside it. etcd, containerd, runc, the CNI plugins and the pods' busybox are Debian's,
# unpacked into the same cache and never installed. About 4 minutes of building on two
# cores, once.
KT_KUBERNETES_VERSION="$(sed -n 's:^require k8s.io/kubernetes \(v[0-9.]*\).*:\1:p; s:^\tk8s.io/kubernetes \(v[0-9.]*\).*:\1:p' "$KT_ROOT/scripts/kubernetes/go.mod" | head -1)"
KT_KUBERNETES="${KT_KUBERNETES:-$HOME/.cache/kafkatunnel/kubernetes-${KT_KUBERNETES_VERSION#v}}"
KT_KUBERNETES_DEBS=(etcd-server containerd runc containernetworking-plugins busybox-static)
# The pods' Java (for Kafka in pods): a Debian root file system with its Java 17, by
# debootstrap (Debian's package), as the container tests' image is made. Root only.
KT_JAVA_ROOTFS="$HOME/.cache/kafkatunnel/images/debian-java17.tar"
# Built whole (sealed), and each binary says it is the pinned release.
kt_kubernetes_built() {
  local binary
  case "$KT_KUBERNETES" in "$KT_CACHE"/*) ;; *) return 0 ;; esac  # the user's own build
  kt_sealed "$KT_KUBERNETES/bin" || return 1
  for binary in kubelet kube-apiserver; do
    [ "$("$KT_KUBERNETES/bin/$binary" --version 2>/dev/null)" = "Kubernetes $KT_KUBERNETES_VERSION" ] || return 1
  done
  # Read whole, then matched: `kubectl ... | grep -q` under pipefail fails whenever grep
  # exits at its match before kubectl has written its last line (SIGPIPE)
  local said
  said="$("$KT_KUBERNETES/bin/kubectl" version --client 2>/dev/null)" || return 1
  grep -qx "Client Version: $KT_KUBERNETES_VERSION" <<<"$said"
}
kt_kubernetes() {
  local go version="$KT_KUBERNETES_VERSION" minor work package
  go="$(command -v go || echo /usr/local/go/bin/go)"
  if ! kt_kubernetes_built; then
    if [ ! -x "$go" ]; then
      kt_log "no Go toolchain: the real-Kubernetes tests will say so"
      return 0
    fi
    kt_log "building Kubernetes $version (kube-apiserver, kubelet, kubectl) into $KT_KUBERNETES"
    minor="${version#v*.}" && minor="${minor%%.*}"
    rm -rf "$KT_KUBERNETES/bin.partial" && mkdir -p "$KT_KUBERNETES/bin.partial"
    (cd "$KT_ROOT/scripts/kubernetes" &&
      GOPATH="$HOME/.cache/kafkatunnel/go" GOMODCACHE="$HOME/.cache/kafkatunnel/go/pkg/mod" \
        GOCACHE="$HOME/.cache/kafkatunnel/go-build" GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        nice "$go" build -trimpath -o "$KT_KUBERNETES/bin.partial/" \
        -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version \
          -X k8s.io/component-base/version.gitMajor=1 \
          -X k8s.io/component-base/version.gitMinor=$minor \
          -X k8s.io/component-base/version.gitTreeState=clean \
          -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl)
    kt_seal "$KT_KUBERNETES/bin.partial"
    rm -rf "$KT_KUBERNETES/bin" && mv "$KT_KUBERNETES/bin.partial" "$KT_KUBERNETES/bin"
    kt_kubernetes_built || { kt_log "the Kubernetes just built does not say it is $version"; return 1; }
  fi
  if ! { kt_sealed "$KT_KUBERNETES/debian" && [ -x "$KT_KUBERNETES/debian/usr/bin/containerd" ] &&
    [ -x "$KT_KUBERNETES/debian/bin/busybox" ]; } &&
    command -v apt-get >/dev/null 2>&1; then
    kt_log "unpacking Debian's ${KT_KUBERNETES_DEBS[*]} (for the tests) into $KT_KUBERNETES/debian"
    work="$(mktemp -d)" && chmod 755 "$work"
    if ! (cd "$work" && apt-get download -q "${KT_KUBERNETES_DEBS[@]}" >/dev/null 2>&1); then
      kt_apt_update  # no package lists yet
      (cd "$work" && apt-get download -q "${KT_KUBERNETES_DEBS[@]}" >/dev/null)
    fi
    rm -rf "$KT_KUBERNETES/debian.partial" && mkdir -p "$KT_KUBERNETES/debian.partial"
    for package in "$work"/*.deb; do dpkg -x "$package" "$KT_KUBERNETES/debian.partial"; done
    kt_seal "$KT_KUBERNETES/debian.partial"
    rm -rf "$work" "$KT_KUBERNETES/debian" && mv "$KT_KUBERNETES/debian.partial" "$KT_KUBERNETES/debian"
  fi
  if ! kt_sealed "$KT_JAVA_ROOTFS" && [ "$(id -u)" = 0 ]; then
    kt_apt_packages debootstrap:debootstrap
    kt_log "making a Debian root file system with Java 17 (for pods) into $KT_JAVA_ROOTFS"
    work="$(mktemp -d)"
    /usr/sbin/debootstrap --variant=minbase --include=openjdk-17-jre-headless \
      "$(. /etc/os-release && echo "$VERSION_CODENAME")" "$work/root" http://deb.debian.org/debian >/dev/null
    rm -rf "$work"/root/var/cache/apt/archives/*.deb "$work"/root/var/lib/apt/lists/*
    mkdir -p "$(dirname "$KT_JAVA_ROOTFS")"
    tar -C "$work/root" -cf "$KT_JAVA_ROOTFS.partial" .
    mv "$KT_JAVA_ROOTFS.partial" "$KT_JAVA_ROOTFS"
    kt_seal "$KT_JAVA_ROOTFS"
    rm -rf "$work"
  fi
}

# Set-up steps side by side: kt_side_by_side "NAME: STEP STEP..." ... Each group's steps run
# one after another (Maven's local repository takes one writer at a time, so every Maven
# step is in one group); the groups run at once, the long builds among them from the start.
# Each line a group prints comes prefixed with its name as it happens. Every group runs to
# its end; then a group that failed is named, and the set-up fails.
kt_side_by_side() {
  local group name names=() failed=() statuses
  statuses="$(mktemp -d)"
  for group in "$@"; do
    name="${group%%:*}"
    names+=("$name")
    # shellcheck disable=SC2086  # the steps are words
    { (for step in ${group#*:}; do "$step"; done) 2>&1; echo "$?" >"$statuses/$name"; } |
      sed -u "s/^/  $name: /" >&2 &
  done
  wait
  for name in "${names[@]}"; do
    [ "$(cat "$statuses/$name" 2>/dev/null)" = 0 ] || failed+=("$name")
  done
  rm -rf "$statuses"
  if [ ${#failed[@]} -gt 0 ]; then
    kt_log "set-up failed in: ${failed[*]} (their lines above, prefixed with the name, say why)"
    return 1
  fi
}
