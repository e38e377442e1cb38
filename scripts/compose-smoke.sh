#!/usr/bin/env bash
# End-to-end check of compose.yaml on this machine: build the image, run the compose swarm, check from
# outside that it trained, run the DPO ring, tear everything down. Exit 0 only if every check passed.
#
#   scripts/compose-smoke.sh            (as root on a bare Debian box; or any user with a running engine)
#
# What it does, in phases (each prints its wall time):
#   tools    installs docker.io / docker-compose / debootstrap with apt-get when missing (root only)
#   engine   uses the running Docker engine, or starts dockerd (niced, log in $SMOKE_WORK) and stops it at the end
#   base     BASE_IMAGE if set; else the cached local/debian:bookworm-minbase; else python:3.11-slim if it
#            can be pulled; else debootstrap (minbase bookworm) + `docker import` into local/debian:bookworm-minbase
#   inputs   a local torch CPU wheel (TORCH_WHEEL=path, or what `pip download --no-index` finds on this
#            machine) goes into .cache/torch-wheels so the build does not download torch; none: the build
#            installs torch from PyTorch's CPU index; and the CA bundle the host's pip uses (PIP_CERT or
#            pip's global.cert), so pip in the build trusts the same HTTPS proxy
#   build    docker build of the project image ($SMOKE_IMAGE); the presets are built inside it
#   grpo     bootstrap + tiny-s, tiny-m, tiny-s-lora, which run until stopped (compose.yaml's default);
#            the compose file's `status` service (`compose run --rm status`, a separate container) must
#            list all three live at once; then, read from each running peer, metrics.jsonl must show
#            rounds 0..$SMOKE_ROUNDS (or more) and groups trained from both other peers, each a peer that
#            status listed; then `compose stop`: each peer finishes its round and exits 0, never restarted
#   dpo      the `dpo` profile (ring of four), the same way: status must list all four live at once; each
#            node must run $SMOKE_DPO_ROUNDS rounds (or more), and in at least half of those, average with
#            both ring neighbours among four peers; then each stops cleanly
#            Nothing here races a fixed round count: how fast the machine is changes only how long it takes.
#   teardown compose down -v (containers, network, volumes), the project image, the wheel copy, dockerd
#            if this script started it. The base image is kept as a cache (SMOKE_KEEP_BASE=0 removes it
#            too when this script made or pulled it).
#
# Knobs: BASE_IMAGE, TORCH_WHEEL, SMOKE_ROUNDS (6: GRPO rounds each peer trains before it is stopped),
# SMOKE_DPO_ROUNDS (8), SMOKE_EVAL_N (100), SMOKE_PROJECT (swarm-node-smoke), SMOKE_IMAGE (swarm-node:smoke),
# SMOKE_KEEP_BASE (1), SMOKE_KEEP_IMAGE (0; 1 keeps the project image and reuses it on the next run, for
# debugging), SMOKE_TIMEOUT_S (1800: the most each wait may take), SMOKE_STOP_TIMEOUT_S (300: for a node to
# finish its round on `compose stop`), SMOKE_BUSY (0; 1 runs a busy loop pinned to each core, at the
# engine's niceness, from the grpo phase on: the loaded-machine check), SMOKE_WORK (a temp dir: dockerd log,
# status and metrics copies, compose logs on failure), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PROJECT=${SMOKE_PROJECT:-swarm-node-smoke}
IMAGE=${SMOKE_IMAGE:-swarm-node:smoke}
ROUNDS=${SMOKE_ROUNDS:-6}
DPO_ROUNDS=${SMOKE_DPO_ROUNDS:-8}
EVAL_N=${SMOKE_EVAL_N:-100}
KEEP_BASE=${SMOKE_KEEP_BASE:-1}
KEEP_IMAGE=${SMOKE_KEEP_IMAGE:-0}
TIMEOUT_S=${SMOKE_TIMEOUT_S:-1800}
STOP_TIMEOUT_S=${SMOKE_STOP_TIMEOUT_S:-300}
BUSY=${SMOKE_BUSY:-0}
CACHED_BASE=local/debian:bookworm-minbase
WHEEL_DIR=.cache/torch-wheels
CA_BUNDLE=.cache/pip-ca.pem
GRPO_PEERS=(tiny-s tiny-m tiny-s-lora)
DPO_PEERS=(dpo-0 dpo-1 dpo-2 dpo-3)
WORK=${SMOKE_WORK:-$(mktemp -d /tmp/compose-smoke.XXXXXX)}
mkdir -p "$WORK"

log() { printf '[smoke %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "FAILED: $*"; exit 1; }

PHASES=()
load1() { cut -d ' ' -f 1 /proc/loadavg; }  # the 1-minute load average, printed with each phase's time
phase_start() { PHASE=$1; PHASE_T0=$(date +%s.%N); PHASE_LOAD0=$(load1); log "== phase $PHASE (load average $(cut -d ' ' -f 1-3 /proc/loadavg))"; }
phase_end() {
  local dt
  dt=$(awk -v a="$PHASE_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  PHASES+=("$PHASE ${dt}s (load $PHASE_LOAD0->$(load1))")
  log "== phase $PHASE done in ${dt}s (load average $(cut -d ' ' -f 1-3 /proc/loadavg))"
}

# ---- cleanup (always runs) ---------------------------------------------------------------------------
# A dockerd leaves its iptables chains and rules, the docker0 bridge, and the FORWARD policy DROP behind when
# it stops: on a machine where other jobs forward traffic (network namespaces, veth pairs), that DROP cuts
# them off. After stopping the dockerd it started, the script removes what that dockerd added and puts the
# FORWARD policy back as it was ($FORWARD_POLICY, read before dockerd started).
FORWARD_POLICY=""
undo_dockerd_network() {
  command -v iptables >/dev/null || return 0
  local table chain rule
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | grep -E -- '^-A ' | grep -vE -- '^-A DOCKER' \
      | grep -E -- 'DOCKER|docker0|br-[0-9a-f]{12}' | while read -r rule; do
        eval "iptables -t $table -D ${rule#-A }" 2>/dev/null
      done
    for chain in DOCKER DOCKER-ISOLATION-STAGE-1 DOCKER-ISOLATION-STAGE-2 DOCKER-USER; do
      iptables -t "$table" -F "$chain" 2>/dev/null && iptables -t "$table" -X "$chain" 2>/dev/null
    done
  done
  [ -n "$FORWARD_POLICY" ] && iptables -P FORWARD "$FORWARD_POLICY"
  ip link show docker0 >/dev/null 2>&1 && ip link delete docker0
  log "removed the dockerd's iptables chains and rules and docker0; FORWARD policy ${FORWARD_POLICY:-unchanged}"
}
STARTED_DOCKERD=""
MADE_BASE=""
MADE_WHEEL_DIR=""
MADE_CA_BUNDLE=""
STATUS_PID=""
BUSY_PIDS=()
COMPOSE=()
cleanup() {
  local rc=$?
  set +e
  if [ ${#BUSY_PIDS[@]} -gt 0 ]; then kill "${BUSY_PIDS[@]}" 2>/dev/null; wait "${BUSY_PIDS[@]}" 2>/dev/null; fi
  [ -n "$STATUS_PID" ] && kill "$STATUS_PID" 2>/dev/null
  if [ ${#COMPOSE[@]} -gt 0 ] && docker info >/dev/null 2>&1; then
    if [ "$rc" -ne 0 ]; then
      log "compose logs (last 40 lines per service) in $WORK/compose.log"
      "${COMPOSE[@]}" --profile dpo logs --no-color --tail 40 >"$WORK/compose.log" 2>&1
      tail -n 80 "$WORK/compose.log"
    fi
    phase_start teardown
    "${COMPOSE[@]}" --profile dpo --profile gpu --profile status down -v --remove-orphans --timeout 30 >/dev/null 2>&1
    left=$(docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT"; \
           docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT"; \
           docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")
    if [ -n "$left" ]; then
      log "left behind by compose down (removing them now): $(echo $left)"
      [ "$rc" -eq 0 ] && rc=1
      docker rm -f -v $(docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT") >/dev/null 2>&1
      docker volume rm $(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT") >/dev/null 2>&1
      docker network rm $(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT") >/dev/null 2>&1
    fi
    phase_end
  fi
  if docker info >/dev/null 2>&1 && [ "$KEEP_IMAGE" != 1 ]; then
    docker image rm "$IMAGE" >/dev/null 2>&1
    # layers of an interrupted or failed build are left untagged: remove the ones this build made
    if [ -f "$WORK/build.log" ]; then
      for id in $(grep -a -o -E -- '---> [0-9a-f]{12}$' "$WORK/build.log" | awk '{ print $2 }' | tac); do
        [ "$(docker image inspect -f '{{len .RepoTags}}' "$id" 2>/dev/null)" = 0 ] && docker image rm "$id" >/dev/null 2>&1
      done
    fi
    if [ -n "$MADE_BASE" ] && [ "$KEEP_BASE" = 0 ]; then
      docker image rm "$MADE_BASE" >/dev/null 2>&1
    fi
  fi
  [ -n "$MADE_WHEEL_DIR" ] && rm -rf "${ROOT:?}/$WHEEL_DIR"
  [ -n "$MADE_CA_BUNDLE" ] && rm -f "${ROOT:?}/$CA_BUNDLE"
  if [ -n "$STARTED_DOCKERD" ]; then
    log "stopping the dockerd this script started (pid $STARTED_DOCKERD)"
    kill "$STARTED_DOCKERD" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 1; done
    kill -0 "$STARTED_DOCKERD" 2>/dev/null || undo_dockerd_network
  fi
  log "phase times: ${PHASES[*]:-none}"
  [ "$rc" -eq 0 ] && log "OK" || log "exit $rc (work dir $WORK)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- tools -------------------------------------------------------------------------------------------
phase_start tools
need=()
command -v docker >/dev/null || need+=(docker.io)
if ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null; then need+=(docker.io); fi
if ! (docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null); then need+=(docker-compose); fi
if [ -z "${BASE_IMAGE:-}" ] && ! command -v debootstrap >/dev/null; then need+=(debootstrap); fi
command -v python3 >/dev/null || need+=(python3)  # reads the status and metrics JSON
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || die "missing ${need[*]} (install them, or run as root on Debian)"
  log "apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if docker compose version >/dev/null 2>&1; then COMPOSE_TOOL=(docker compose); else COMPOSE_TOOL=(docker-compose); fi
log "compose: $("${COMPOSE_TOOL[@]}" version 2>/dev/null | head -n 1)"
phase_end

# ---- engine ------------------------------------------------------------------------------------------
phase_start engine
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || die "no Docker engine is reachable and starting dockerd needs root"
  log "no engine running: starting dockerd (log: $WORK/dockerd.log)"
  FORWARD_POLICY=$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" { print $3 }')
  nice -n 10 dockerd >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -n 20 "$WORK/dockerd.log"; die "dockerd did not come up in 60 s"; }
fi
log "engine: $(docker version --format 'server {{.Server.Version}}' 2>/dev/null)"
phase_end

# ---- base image --------------------------------------------------------------------------------------
phase_start base
if [ -n "${BASE_IMAGE:-}" ]; then
  BASE=$BASE_IMAGE
elif docker image inspect "$CACHED_BASE" >/dev/null 2>&1; then
  BASE=$CACHED_BASE
  log "using the cached base image $BASE (remove it with: docker image rm $BASE)"
elif docker image inspect python:3.11-slim >/dev/null 2>&1 || timeout 120 docker pull -q python:3.11-slim >/dev/null 2>&1; then
  BASE=python:3.11-slim
else
  [ "$(id -u)" = 0 ] || die "no registry image and debootstrap needs root: set BASE_IMAGE"
  log "no registry image: debootstrap --variant=minbase bookworm"
  rootfs="$WORK/rootfs"
  nice -n 10 debootstrap --variant=minbase bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -n 20 "$WORK/debootstrap.log"; die "debootstrap failed"; }
  tar -C "$rootfs" -c . | docker import - "$CACHED_BASE" >/dev/null
  rm -rf "$rootfs"
  BASE=$CACHED_BASE
  MADE_BASE=$CACHED_BASE
  log "built $BASE (kept as a cache; SMOKE_KEEP_BASE=0 removes it at the end)"
fi
if [ "$BASE" = python:3.11-slim ] && [ -z "${BASE_IMAGE:-}" ]; then MADE_BASE=$BASE; fi
log "base image: $BASE"
phase_end

# ---- torch wheel -------------------------------------------------------------------------------------
phase_start inputs
if [ ! -d "$WHEEL_DIR" ]; then MADE_WHEEL_DIR=1; fi
mkdir -p "$WHEEL_DIR"
if [ -n "${TORCH_WHEEL:-}" ]; then
  cp "$TORCH_WHEEL" "$WHEEL_DIR/"
elif ! ls "$WHEEL_DIR"/torch-*.whl >/dev/null 2>&1; then
  # --no-index: only wheels already on this machine (pip's find-links); never a multi-GB download
  python3 -m pip download "torch==2.13.0" --no-deps --no-index -q -d "$WHEEL_DIR" >/dev/null 2>&1 || true
fi
if ls "$WHEEL_DIR"/torch-*.whl >/dev/null 2>&1; then
  log "torch wheel for the build: $(basename "$(ls "$WHEEL_DIR"/torch-*.whl | head -n 1)")"
else
  log "no local torch wheel: the build installs torch from PyTorch's CPU index"
fi

# pip inside the build trusts what the host's pip trusts (a TLS-intercepting proxy's CA, for example)
host_cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$host_cert" ] && [ -f "$host_cert" ] && [ ! -f "$CA_BUNDLE" ]; then
  cp "$host_cert" "$CA_BUNDLE"
  MADE_CA_BUNDLE=1
  log "pip CA bundle for the build: $host_cert"
fi
phase_end

# ---- build -------------------------------------------------------------------------------------------
phase_start build
if [ "$KEEP_IMAGE" = 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "SMOKE_KEEP_IMAGE=1: reusing $IMAGE (docker image rm $IMAGE to rebuild)"
else
  # The Docker CLI defaults to BuildKit through the buildx plugin; without the plugin, use the classic builder.
  docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0
  log "building $IMAGE from $BASE (log: $WORK/build.log)"
  if ! nice -n 10 docker build --force-rm -t "$IMAGE" --build-arg "BASE_IMAGE=$BASE" --build-arg "TORCH_WHEEL_DIR=$WHEEL_DIR" \
       --build-arg "PIP_CA_BUNDLE=$CA_BUNDLE" . >"$WORK/build.log" 2>&1; then
    tail -n 40 "$WORK/build.log"
    die "image build failed"
  fi
fi
log "image $IMAGE: $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
phase_end

# The nodes run with compose.yaml's defaults, as a user's would: until stopped. The checks below stop them
# once they have been seen (the rounds a node trains do not race the checks, however fast the machine).
# What only a slow machine needs is generous here, so that a slow node never fails a check that a stuck one
# should: 180 s per join attempt (the libp2p daemon's start in a CPU-limited container), and the DPO ring's
# wait for its four nodes as long as this script waits for anything.
unset SWARM_NODE_ROUNDS SWARM_NODE_DPO_ROUNDS
export SWARM_NODE_IMAGE=$IMAGE SWARM_NODE_BASE_IMAGE=$BASE SWARM_NODE_EVAL_N=$EVAL_N SWARM_NODE_EVAL_EVERY=$ROUNDS \
       SWARM_NODE_BOOTSTRAP_PORT=${SWARM_NODE_BOOTSTRAP_PORT:-31337} \
       SWARM_NODE_JOIN_TIMEOUT_S=${SWARM_NODE_JOIN_TIMEOUT_S:-180} SWARM_NODE_DPO_JOIN_WAIT_S=${SWARM_NODE_DPO_JOIN_WAIT_S:-$TIMEOUT_S}
COMPOSE=("${COMPOSE_TOOL[@]}" -p "$PROJECT" -f "$ROOT/compose.yaml")

# ---- helpers -----------------------------------------------------------------------------------------
# service -> container id, noted once after `up` (a restart keeps the id), so that polls cost no compose call
declare -A CIDS=()
note_cids() { local s; for s in "$@"; do CIDS[$s]=$("${COMPOSE[@]}" --profile dpo ps -q "$s" 2>/dev/null | head -n 1); done; }
cid_of() {
  if [ -n "${CIDS[$1]:-}" ]; then printf '%s\n' "${CIDS[$1]}"
  else "${COMPOSE[@]}" --profile dpo ps -q "$1" 2>/dev/null | head -n 1; fi
}
volume_of() {
  docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.volume=$1" \
    | head -n 1
}

# "status exit-code restarts" of a service's container
state_of() {
  local cid
  cid=$(cid_of "$1")
  [ -n "$cid" ] || die "no container for $1"
  docker inspect -f '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' "$cid"
}

# Fail at once when a node crashed (its restart policy would bring it back, but a smoke run wants none)
# or stopped, instead of waiting on for something it will never do.
check_running() {
  local s st
  for s in "$@"; do
    st=$(state_of "$s")
    case "$st" in
      "running "*" 0"|"created "*" 0") ;;
      *) docker logs --tail 20 "$(cid_of "$s")" 2>&1 | sed "s/^/  $s | /"
         die "$s is not running as it should (status exit-code restarts: $st)" ;;
    esac
  done
}

# The compose file's own `status` service (`compose run --rm status`, what a user runs): it waits for the
# bootstrap's address file, joins once as a throw-away client, and looks every 2 s until `want` members are
# live at once. It runs in the background while this polls the nodes, so a crash fails at once. The JSON
# listing is kept in $WORK/status-<swarm>.json and printed.
# $1 swarm id, $2 how many members, rest: the services that must stay running meanwhile.
list_members() {
  local swarm=$1 want=$2
  shift 2
  log "compose run --rm status --swarm $swarm --wait-for $want (log: $WORK/status-$swarm.err)"
  "${COMPOSE[@]}" run --rm --no-deps -T status --swarm "$swarm" --wait-for "$want" --wait-s "$TIMEOUT_S" --json \
    >"$WORK/status-$swarm.json" 2>"$WORK/status-$swarm.err" </dev/null &
  STATUS_PID=$!
  while kill -0 "$STATUS_PID" 2>/dev/null; do check_running "$@"; sleep 5; done
  if ! wait "$STATUS_PID"; then
    STATUS_PID=""
    tail -n 20 "$WORK/status-$swarm.err"
    return 1
  fi
  STATUS_PID=""
  python3 "$ROOT/scripts/compose_smoke_check.py" listing "$WORK" "$swarm"
}

# Copy each running node's metrics.jsonl to $WORK (a node appends a line per round; a half-written last
# line is skipped by the checks while they wait, and is whole once the node has stopped).
read_metrics() {
  local s
  for s in "$@"; do
    docker exec "$(cid_of "$s")" cat /state/metrics.jsonl >"$WORK/metrics-$s.jsonl" 2>/dev/null || true
  done
}

# After the nodes stopped: read metrics.jsonl from each volume (a read-only mount in a one-off container).
collect_metrics() {
  local s
  for s in "$@"; do
    docker run --rm --network none -v "$(volume_of "state-$s"):/state:ro" "$IMAGE" cat /state/metrics.jsonl \
      >"$WORK/metrics-$s.jsonl" || die "no metrics.jsonl on the volume of $s"
  done
}

# Poll until `$1 wait ...` (a check below) passes on the nodes' metrics, failing at once on a crash.
wait_until_trained() {
  local check=$1 end=$(( $(date +%s) + TIMEOUT_S )) last=0 now
  shift
  while :; do
    check_running "$@"
    read_metrics "$@"
    if "$check" wait "$@" >"$WORK/progress.txt" 2>&1; then return 0; fi
    now=$(date +%s)
    [ "$now" -lt "$end" ] || { cat "$WORK/progress.txt"; die "not trained enough after ${TIMEOUT_S}s"; }
    if [ $(( now - last )) -ge 30 ]; then
      log "waiting (load $(load1)): $(head -n 1 "$WORK/progress.txt")"; last=$now
    fi
    sleep 10
  done
}

# SIGTERM (compose stop): each node finishes its round, checkpoints and leaves; it must exit 0, never restarted.
stop_nodes() {
  local s st
  log "compose stop ${*} (each finishes its round and checkpoints; up to ${STOP_TIMEOUT_S}s)"
  "${COMPOSE[@]}" --profile dpo stop -t "$STOP_TIMEOUT_S" "$@" 2>&1 | sed 's/^/  /'
  for s in "$@"; do
    st=$(state_of "$s")
    [ "$st" = "exited 0 0" ] || { docker logs --tail 20 "$(cid_of "$s")" 2>&1 | sed "s/^/  $s | /"
                                  die "$s did not stop cleanly (status exit-code restarts: $st)"; }
  done
  log "stopped cleanly: ${*}"
}

# The checks (scripts/compose_smoke_check.py) on the copies in $WORK. `wait`: exit 1, with one progress line,
# until each node has trained enough; `final`: the same on the whole files, with a report per node.
check_grpo() { python3 "$ROOT/scripts/compose_smoke_check.py" grpo "$1" "$WORK" "$ROUNDS" "${@:2}"; }
check_dpo() { python3 "$ROOT/scripts/compose_smoke_check.py" dpo "$1" "$WORK" "$DPO_ROUNDS" "${@:2}"; }

# SMOKE_BUSY=1: from here on, a busy loop pinned to each core, at the nodes' niceness (the engine's), so the
# swarm phases run on a loaded machine.
if [ "$BUSY" = 1 ]; then
  ni=$(ps -o ni= -p "$(pgrep -o -x dockerd || echo $$)" | tr -d ' ')
  for core in $(seq 0 $(( $(nproc) - 1 ))); do
    taskset -c "$core" nice -n "${ni:-0}" sh -c 'while :; do :; done' &
    BUSY_PIDS+=("$!")
  done
  log "SMOKE_BUSY=1: ${#BUSY_PIDS[@]} busy loop(s), one pinned to each core, at nice ${ni:-0} (pids ${BUSY_PIDS[*]})"
fi

# ---- grpo --------------------------------------------------------------------------------------------
phase_start grpo
log "compose up: bootstrap + ${GRPO_PEERS[*]} (until stopped; stopped here after $ROUNDS rounds each, eval_n $EVAL_N)"
"${COMPOSE[@]}" up -d --no-build bootstrap "${GRPO_PEERS[@]}" 2>&1 | sed 's/^/  /'
note_cids "${GRPO_PEERS[@]}"
list_members demo "${#GRPO_PEERS[@]}" "${GRPO_PEERS[@]}" || die "swarm-node status did not list the three GRPO peers"
wait_until_trained check_grpo "${GRPO_PEERS[@]}"
log "trained: $(head -n 1 "$WORK/progress.txt")"
stop_nodes "${GRPO_PEERS[@]}"
collect_metrics "${GRPO_PEERS[@]}"
check_grpo final "${GRPO_PEERS[@]}" || die "GRPO metrics check failed"
phase_end

# ---- dpo ---------------------------------------------------------------------------------------------
phase_start dpo
log "compose --profile dpo up: ${DPO_PEERS[*]} (until stopped; stopped here after $DPO_ROUNDS rounds each)"
"${COMPOSE[@]}" --profile dpo up -d --no-build bootstrap "${DPO_PEERS[@]}" 2>&1 | sed 's/^/  /'
note_cids "${DPO_PEERS[@]}"
list_members dpo-demo "${#DPO_PEERS[@]}" "${DPO_PEERS[@]}" || die "swarm-node status did not list the four DPO nodes"
wait_until_trained check_dpo "${DPO_PEERS[@]}"
log "trained: $(head -n 1 "$WORK/progress.txt")"
stop_nodes "${DPO_PEERS[@]}"
collect_metrics "${DPO_PEERS[@]}"
check_dpo final "${DPO_PEERS[@]}" || die "DPO metrics check failed"
phase_end
