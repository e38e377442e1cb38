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
#   grpo     bootstrap + tiny-s, tiny-m, tiny-s-lora for $SMOKE_ROUNDS rounds; `swarm-node status` from a
#            separate container must list all three; then each peer's metrics.jsonl, read from its volume,
#            must show every round and groups trained from both other peers
#   dpo      the `dpo` profile (ring of four) for $SMOKE_DPO_ROUNDS rounds; status must list all four; each
#            node's metrics must show four peers and both ring neighbours mixed in
#   teardown compose down -v (containers, network, volumes), the project image, the wheel copy, dockerd
#            if this script started it. The base image is kept as a cache (SMOKE_KEEP_BASE=0 removes it
#            too when this script made or pulled it).
#
# Knobs: BASE_IMAGE, TORCH_WHEEL, SMOKE_ROUNDS (6), SMOKE_DPO_ROUNDS (8), SMOKE_EVAL_N (100),
# SMOKE_PROJECT (swarm-node-smoke), SMOKE_IMAGE (swarm-node:smoke), SMOKE_KEEP_BASE (1), SMOKE_KEEP_IMAGE (0;
# 1 keeps the project image and reuses it on the next run, for debugging), SMOKE_TIMEOUT_S (900
# per phase), SMOKE_WORK (a temp dir: dockerd log, metrics copies, compose logs on failure), DEBIAN_MIRROR.
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
TIMEOUT_S=${SMOKE_TIMEOUT_S:-900}
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
phase_start() { PHASE=$1; PHASE_T0=$(date +%s.%N); log "== phase $PHASE"; }
phase_end() {
  local dt
  dt=$(awk -v a="$PHASE_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  PHASES+=("$PHASE ${dt}s")
  log "== phase $PHASE done in ${dt}s"
}

# ---- cleanup (always runs) ---------------------------------------------------------------------------
STARTED_DOCKERD=""
MADE_BASE=""
MADE_WHEEL_DIR=""
MADE_CA_BUNDLE=""
COMPOSE=()
cleanup() {
  local rc=$?
  set +e
  if [ ${#COMPOSE[@]} -gt 0 ] && docker info >/dev/null 2>&1; then
    if [ "$rc" -ne 0 ]; then
      log "compose logs (last 40 lines per service) in $WORK/compose.log"
      "${COMPOSE[@]}" --profile dpo logs --no-color --tail 40 >"$WORK/compose.log" 2>&1
      tail -n 80 "$WORK/compose.log"
    fi
    phase_start teardown
    "${COMPOSE[@]}" --profile dpo --profile gpu down -v --remove-orphans --timeout 30 >/dev/null 2>&1
    left=$(docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT"; \
           docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT"; \
           docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")
    if [ -n "$left" ]; then log "left behind: $left"; [ "$rc" -eq 0 ] && rc=1; fi
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

export SWARM_NODE_IMAGE=$IMAGE SWARM_NODE_BASE_IMAGE=$BASE SWARM_NODE_ROUNDS=$ROUNDS SWARM_NODE_DPO_ROUNDS=$DPO_ROUNDS \
       SWARM_NODE_EVAL_N=$EVAL_N SWARM_NODE_EVAL_EVERY=$ROUNDS SWARM_NODE_BOOTSTRAP_PORT=${SWARM_NODE_BOOTSTRAP_PORT:-31337}
COMPOSE=("${COMPOSE_TOOL[@]}" -p "$PROJECT" -f "$ROOT/compose.yaml")

# ---- helpers -----------------------------------------------------------------------------------------
cid_of() { "${COMPOSE[@]}" --profile dpo ps -q "$1" 2>/dev/null | head -n 1; }
volume_of() {
  docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.volume=$1" \
    | head -n 1
}
network_of() { docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | head -n 1; }

# `swarm-node status --json` from a one-off container that is no part of the swarm (throw-away identity,
# client mode), joined through the address file the bootstrap wrote.
status_json() {
  docker run --rm --network "$(network_of)" -v "$(volume_of swarm-addrs):/swarm:ro" "$IMAGE" \
    sh -c 'swarm-node status --initial-peers $(grep "^/" /swarm/bootstrap.maddrs) --swarm "$0" --json --retries 1 --timeout 60' "$1" \
    2>>"$WORK/status.err"
}

# "status exit-code restarts" of a service's container
state_of() {
  local cid
  cid=$(cid_of "$1")
  [ -n "$cid" ] || die "no container for $1"
  docker inspect -f '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' "$cid"
}

# A node that failed for good: exited non-zero with its restart policy (on-failure:3) used up, or dead.
# A crash that the policy restarts is allowed (it is logged and shows in the metrics checks).
failed_for_good() {
  case "$1" in
    dead*) return 0 ;;
    "exited 0 "*) return 1 ;;
    exited*) [ "${1##* }" -ge 3 ] ;;
    *) return 1 ;;
  esac
}

# Fail at once when one of these services failed for good, instead of polling on.
check_running() {
  local s st
  for s in "$@"; do
    st=$(state_of "$s")
    if failed_for_good "$st"; then
      docker logs --tail 20 "$(cid_of "$s")" 2>&1 | sed "s/^/  $s | /"
      die "$s failed (status exit-code restarts: $st)"
    fi
  done
}

# Poll `swarm-node status` while the nodes run, until it has listed `want` distinct members (a status call
# takes seconds to tens of seconds on a busy machine, so short runs are seen over several polls). Every
# listing is kept in $WORK/status-<swarm>.json (the last record of each peer id); fails when a node crashed
# or all of them finished before status had seen them all.
# $1 swarm id, $2 how many members, rest: the services whose containers must be running.
wait_for_members() {
  local swarm=$1 want=$2 end=$(( $(date +%s) + TIMEOUT_S )) out n seen
  shift 2
  rm -f "$WORK/status-$swarm.json"
  while [ "$(date +%s)" -lt "$end" ]; do
    check_running "$@"
    if out=$(status_json "$swarm"); then
      seen=$(printf '%s' "$out" | python3 -c '
import json, sys
from pathlib import Path
path, now = Path(sys.argv[1]), json.load(sys.stdin)
members = {m["peer_id"]: m for m in (json.loads(path.read_text()) if path.exists() else [])}
members.update({m["peer_id"]: m for m in now})
path.write_text(json.dumps(list(members.values()), indent=1))
print(len(now), len(members))' "$WORK/status-$swarm.json") || seen="? ?"
      n=${seen% *}
      log "status --swarm $swarm: $n live member(s) now, ${seen#* } seen so far"
      if [ "${seen#* }" != "?" ] && [ "${seen#* }" -ge "$want" ]; then
        python3 -c '
import json, sys
for m in json.load(open(sys.argv[1])):
    print("  %s  %-4s  %-12s  round %s" % (m["peer_id"], m["mode"], m["model_name"], m["round"]))' "$WORK/status-$swarm.json"
        return 0
      fi
    fi
    all_done=1
    for s in "$@"; do
      case "$(state_of "$s")" in "exited 0 "*) ;; *) all_done="" ;; esac
    done
    [ -z "$all_done" ] || { log "every node finished before status had listed $want"; return 1; }
    sleep 3
  done
  return 1
}

# Wait until each service's container has exited with 0 (restarts allowed, and reported).
wait_exited() {
  local end=$(( $(date +%s) + TIMEOUT_S )) s st
  for s in "$@"; do
    while :; do
      st=$(state_of "$s")
      case "$st" in "exited 0 "*) break ;; esac
      if failed_for_good "$st"; then
        docker logs --tail 20 "$(cid_of "$s")" 2>&1 | sed "s/^/  $s | /"
        die "$s failed (status exit-code restarts: $st)"
      fi
      [ "$(date +%s)" -lt "$end" ] || die "$s still running after ${TIMEOUT_S}s ($st)"
      sleep 5
    done
    log "$s: finished (status exit-code restarts: $st)"
  done
}

# Read each service's metrics.jsonl from its volume (a read-only mount in a one-off container).
collect_metrics() {
  local s
  for s in "$@"; do
    docker run --rm --network none -v "$(volume_of "state-$s"):/state:ro" "$IMAGE" cat /state/metrics.jsonl \
      >"$WORK/metrics-$s.jsonl" || die "no metrics.jsonl on the volume of $s"
  done
}

# ---- grpo --------------------------------------------------------------------------------------------
phase_start grpo
log "compose up: bootstrap + ${GRPO_PEERS[*]} for $ROUNDS rounds (eval_n $EVAL_N)"
"${COMPOSE[@]}" up -d --no-build bootstrap "${GRPO_PEERS[@]}" 2>&1 | sed 's/^/  /'
wait_for_members demo 3 "${GRPO_PEERS[@]}" || die "swarm-node status never listed the three GRPO peers"
wait_exited "${GRPO_PEERS[@]}"
collect_metrics "${GRPO_PEERS[@]}"
python3 - "$WORK" "$ROUNDS" "${GRPO_PEERS[@]}" <<'PY' || die "GRPO metrics check failed"
import json, sys
from pathlib import Path

work, rounds, peers = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
status = json.loads((work / "status-demo.json").read_text())
listed = {m["peer_id"]: m["model_name"] for m in status}
problems = []
for peer in peers:
    rows = [json.loads(ln) for ln in (work / f"metrics-{peer}.jsonl").read_text().splitlines() if ln.strip()]
    got = [r["round"] for r in rows]
    if got != list(range(rounds + 1)):
        problems.append(f"{peer}: rounds {got}, expected 0..{rounds}")
        continue
    by_model: dict[str, int] = {}
    for r in rows[1:]:
        for key, n in (r.get("external_groups_by_peer") or {}).items():
            suffix, _, model = key.partition(":")
            ids = [pid for pid in listed if pid.endswith(suffix)]
            if len(ids) != 1:
                problems.append(f"{peer}: groups from {key}, a peer that `swarm-node status` did not list")
            by_model[model] = by_model.get(model, 0) + int(n)
    trained = sum(int(r.get("external_groups") or 0) for r in rows[1:])
    others = [p for p in peers if p != peer]
    missing = [o for o in others if by_model.get(o, 0) <= 0]
    if missing:
        problems.append(f"{peer}: no groups received from {missing} (by model: {by_model})")
    if trained <= 0:
        problems.append(f"{peer}: trained on no external groups")
    acc0, acc1 = rows[0]["eval_accuracy"], rows[-1]["eval_accuracy"]
    rejected: dict[str, int] = {}
    for r in rows[1:]:
        for k, n in (r.get("rejected") or {}).items():
            rejected[k] = rejected.get(k, 0) + int(n)
    print(f"  {peer:12s} rounds {rounds}: external groups used {trained} (received by model {by_model}), "
          f"eval accuracy {acc0:.3f} -> {acc1:.3f} (n={rows[-1].get('eval_n')}), rejected {rejected or 'none'}")
if problems:
    print("\n".join("  PROBLEM " + p for p in problems))
    sys.exit(1)
PY
phase_end

# ---- dpo ---------------------------------------------------------------------------------------------
phase_start dpo
log "compose --profile dpo up: ${DPO_PEERS[*]} for $DPO_ROUNDS rounds"
"${COMPOSE[@]}" --profile dpo up -d --no-build bootstrap "${DPO_PEERS[@]}" 2>&1 | sed 's/^/  /'
wait_for_members dpo-demo 4 "${DPO_PEERS[@]}" || die "swarm-node status never listed the four DPO nodes"
wait_exited "${DPO_PEERS[@]}"
collect_metrics "${DPO_PEERS[@]}"
python3 - "$WORK" "$DPO_ROUNDS" "${DPO_PEERS[@]}" <<'PY' || die "DPO metrics check failed"
import json, sys
from pathlib import Path

work, rounds, peers = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
listed = {m["peer_id"] for m in json.loads((work / "status-dpo-demo.json").read_text())}
problems, ids = [], {}
for peer in peers:
    rows = [json.loads(ln) for ln in (work / f"metrics-{peer}.jsonl").read_text().splitlines() if ln.strip()]
    if len(rows) != rounds:
        problems.append(f"{peer}: {len(rows)} rows, expected {rounds}")
        continue
    ids[peer] = rows[-1]["peer_id"]
    if ids[peer] not in listed:
        problems.append(f"{peer}: peer id {ids[peer]} was not listed by `swarm-node status`")
    full = [r for r in rows if r.get("num_peers") == 4 and len(r.get("neighbours") or []) == 2]
    if len(full) < rounds // 2:
        problems.append(f"{peer}: only {len(full)} of {rounds} rounds mixed with both ring neighbours among 4 peers")
    acc = [r["heldout_pref_acc"] for r in rows if r.get("heldout_pref_acc") is not None]
    print(f"  {peer}: {len(full)}/{rounds} rounds averaged with both neighbours, "
          f"neighbours {sorted(set(n for r in rows for n in (r.get('neighbours') or [])))[:4]}, "
          f"held-out preference accuracy {acc[0]:.3f} -> {acc[-1]:.3f}, "
          f"consensus distance {rows[0].get('consensus_distance')} -> {rows[-1].get('consensus_distance')}")
if len(set(ids.values())) != len(peers):
    problems.append(f"peer ids not distinct: {ids}")
if problems:
    print("\n".join("  PROBLEM " + p for p in problems))
    sys.exit(1)
PY
phase_end
