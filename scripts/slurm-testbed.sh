#!/usr/bin/env bash
# A real Slurm cluster (Debian 12's slurm-wlm 22.05) on this one machine, for tests of tools that
# submit multi-node jobs. One slurmctld + N slurmd "nodes" (default 3), munge auth, no cgroups,
# accounting database only on request. Everything it writes lives under $TB (/tmp/slurm-test), plus
# the named network namespaces slurmtb-* in netns mode; it runs as root.
#
# usage: slurm-testbed.sh up [N] | down | status | env | check | exec CMD [ARGS...]
#   up      install packages if missing, (re)start a clean cluster, wait until all nodes are idle.
#           Idempotent: if the cluster is already healthy it only prints how to use it.
#   down    kill everything the test bed started (daemons, job steps, jobs), remove its namespaces.
#   status  exit 0 and print sinfo if healthy, exit 1 otherwise.
#   env     print `export ...` lines: eval "$(slurm-testbed.sh env)"; then sbatch/srun/squeue... work.
#   exec    run a command as if on the login node (netns mode: inside the controller's namespace,
#           with the nodes' names resolvable), with SLURM_CONF set.
#   check   smoke test of a running cluster: `srun -N2` and `sbatch --wait -N2` really span 2 nodes.
#   node-kill nX   a node's power cut: SIGKILL every process of node nX (its slurmd, job steps and their
#           tasks: all that runs in its UTS namespace); slurmctld finds it gone after SlurmdTimeout.
#   node-start nX  start node nX's slurmd again; it registers and is idle again (ReturnToService=2).
#
# Modes (SLURM_TB_MODE, remembered by `up` for down/status). multi is the default: every address is on
# the loopback; netns puts private addresses inside namespaces that this script creates and removes.
#   netns           each node is its own network + UTS + mount namespace: hostname nX, address
#                   10.213.0.(10+X)/24 on a bridge that lives in the controller's namespace
#                   "slurmtb-ctl" (10.213.0.1, host name tbctl). Nothing is added to the root
#                   namespace: no address, no route, no /etc/hosts line. Own ports per node (torchrun's
#                   29500 can't collide with anything else on the machine); /etc/hosts inside the
#                   namespaces is a bind mount of $TB/hosts. Clients reach slurmctld through the
#                   wrappers in $TB/bin (nsenter into slurmtb-ctl), so put $TB/bin first in PATH.
#   multi (default) Debian's slurmd is built with --enable-multiple-slurmd: all slurmds in the root
#                   network namespace, node nX at 127.0.0.(10+X) port 1701X, controller on
#                   127.0.0.1:16817; each slurmd still gets its own UTS + mount namespace (hostname
#                   nX, /etc/hosts = $TB/hosts). Clients need only SLURM_CONF, but the nodes share one
#                   port space with each other and with everything else on the machine (29500!), and
#                   "n1" resolves only inside jobs and `exec`, not in the root mount namespace.
# Other knobs: SLURM_TB_CPUS (per node, default 4), SLURM_TB_MEM_MB (per node, default 4000),
#              SLURM_TB_GPUS (fake gres/gpu per node, default 0: File= points at /dev/null copies),
#              SLURM_TB_DBD=1: also run MariaDB + slurmdbd (in the controller's namespace) so that
#              sacct/sacctmgr work; without it sacct says "Slurm accounting storage is disabled".
#              SLURM_TB_CRED_EXPIRE (default 10 s; Slurm's default is 120): the credential lifetime,
#              which is also how long a requeued job waits before it may start again.
#              With SLURM_TB_DBD=1 associations are enforced (a bad --account is refused, as on a real
#              cluster): account $SLURM_TB_ACCOUNT (default testlab) holds root and the users in
#              SLURM_TB_USERS (comma-separated, default none); add more with `sacctmgr -i add user NAME
#              account=testlab`.
# Debian's default client configuration, /etc/slurm/slurm.conf, becomes a link to the test bed's (unless
# a real file is there), so any user's sbatch/squeue work without SLURM_CONF, e.g. over a plain SSH login.
# `up` always starts from empty state (job ids restart at 1, accounting database emptied).
# (Copied from the project's shared tools; the repository's copy adds the two paragraphs above.)
set -euo pipefail

TB=/tmp/slurm-test
CONF=$TB/etc/slurm.conf
NS_PREFIX=slurmtb
NET=10.213.0
cmd=${1:-status}

log() { printf '%s\n' "$*" >&2; }
UP_STARTED=0
die() {  # a failed `up` takes down what it started (logs stay in $TB/log)
  log "slurm-testbed: $*"
  if [ "$UP_STARTED" = 1 ]; then UP_STARTED=0; do_down >/dev/null 2>&1 || true; fi
  exit 1
}
[ "$(id -u)" = 0 ] || die "must run as root"

# --- state ----------------------------------------------------------------------------------
load_state() { MODE=multi; N=3; DBD=0; [ -f "$TB/state" ] && . "$TB/state"; return 0; }
alive() {  # pid is running (not a zombie) and its command line mentions $2
  local pid=$1 want=$2 st
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$want"
}
pidof_file() { [ -s "$1" ] && cat "$1" || true; }
kill_pidfile() {  # kill the pid in file $1 if it is ours (cmdline contains $2)
  local pid; pid=$(pidof_file "$1")
  if alive "$pid" "$2"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" "$2" || break; sleep 0.1; done
    alive "$pid" "$2" && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" -- "$@"; }
my_ancestry() { local p=$$; while [ "${p:-0}" -gt 1 ]; do echo "$p"; p=$(awk '/^PPid:/{print $2}' "/proc/$p/status" 2>/dev/null); done; }
# Processes the test bed started: everything in its network namespaces, and everything that runs
# with its own UTS namespace and $TB/hosts bind-mounted on /etc/hosts (daemons started by ns_start,
# their slurmstepds and job tasks, in either mode). Never this script or its ancestors
# (`slurm-testbed.sh exec sh -c '... slurm-testbed.sh down'` must not kill itself).
our_pids() {
  local skip p ns my_uts; skip=" $(my_ancestry | tr '\n' ' ') "; my_uts=$(readlink /proc/self/ns/uts)
  {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NS_PREFIX-(n[0-9]+|ctl)$" || true); do
      ip netns pids "$ns" 2>/dev/null || true
    done
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$(readlink "/proc/$p/ns/uts" 2>/dev/null)" != "$my_uts" ] || continue
      grep -qsF "${TB##*/}/hosts /etc/hosts " "/proc/$p/mountinfo" 2>/dev/null && echo "$p"
    done
  } | sort -un | while read -r p; do
    case "$skip" in *" $p "*) continue;; esac
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] || [ ! -e "/proc/$p" ] || echo "$p"
  done
}

client() {  # run a Slurm client command the way the wrappers do
  if [ "$MODE" = netns ]; then SLURM_CONF=$CONF in_ns "$NS_PREFIX-ctl" "$@"
  else SLURM_CONF=$CONF "$@"; fi
}

healthy() {
  load_state
  [ -f "$CONF" ] || return 1
  alive "$(pidof_file "$TB/munge/munged.pid")" "$TB/munge" || return 1
  alive "$(pidof_file "$TB/run/slurmctld.pid")" "$CONF" || return 1
  local i
  for i in $(seq 1 "$N"); do alive "$(pidof_file "$TB/run/slurmd-n$i.pid")" "$CONF" || return 1; done
  if [ "$DBD" = 1 ]; then
    alive "$(pidof_file "$TB/run/mariadbd.pid")" "$TB/db" || return 1
    alive "$(pidof_file "$TB/run/slurmdbd.pid")" slurmdbd || return 1
  fi
  client scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
  # every node answers (idle, allocated, mixed or completing are all fine)
  ! client sinfo -h -N -o '%T' 2>/dev/null | grep -Eqv '^(idle|allocated|mixed|completing)$'
}

print_env() {
  echo "export SLURM_CONF=$CONF"
  echo "export PATH=$TB/bin:\$PATH"
}

# --- install --------------------------------------------------------------------------------
install_pkgs() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  command -v nsenter >/dev/null || missing+=(util-linux)
  command -v ip >/dev/null || missing+=(iproute2)
  if [ "$DBD" = 1 ]; then
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v mariadbd >/dev/null || missing+=(mariadb-server)
  fi
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]} ..."
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=600)
  "${apt[@]}" install --no-install-recommends "${missing[@]}" >"$TB/apt.log" 2>&1 || {
    apt-get update -q >>"$TB/apt.log" 2>&1
    "${apt[@]}" install --no-install-recommends "${missing[@]}" >>"$TB/apt.log" 2>&1 || die "apt-get install failed, see $TB/apt.log"
  }
}

# --- config ---------------------------------------------------------------------------------
write_conf() {
  local cpus=${SLURM_TB_CPUS:-4} mem=${SLURM_TB_MEM_MB:-4000} gpus=${SLURM_TB_GPUS:-0}
  local ctl_host ctl_addr ctl_port d_port nodes="" i gres="" gresline="" acct
  if [ "$MODE" = netns ]; then ctl_host=tbctl; ctl_addr=$NET.1; ctl_port=6817; d_port=6818
  else ctl_host=tbctl; ctl_addr=127.0.0.1; ctl_port=16817; d_port=16818; fi
  if [ "$DBD" = 1 ]; then
    acct="JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=10
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$ctl_addr
AccountingStoragePort=$((ctl_port + 2))
# for slurmdbd connections the munge socket comes from here, not from AuthInfo
AccountingStoragePass=$TB/munge/munge.socket
AccountingStorageEnforce=associations"
    (umask 077; cat >"$TB/etc/slurmdbd.conf" <<EOF
DbdHost=$ctl_host
DbdAddr=$ctl_addr
DbdPort=$((ctl_port + 2))
AuthType=auth/munge
AuthInfo=socket=$TB/munge/munge.socket
SlurmUser=root
LogFile=$TB/log/slurmdbd.log
PidFile=$TB/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$TB/db/pass")
StorageLoc=slurm_acct_db
EOF
    )
  else
    acct="JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none"
  fi
  if [ "$gpus" -gt 0 ]; then
    gresline="GresTypes=gpu"; gres=" Gres=gpu:$gpus"
    mkdir -p "$TB/dev"
    for i in $(seq 0 $((gpus - 1))); do [ -e "$TB/dev/gpu$i" ] || mknod "$TB/dev/gpu$i" c 1 3; done
    echo "Name=gpu File=$TB/dev/gpu[0-$((gpus - 1))]" >"$TB/etc/gres.conf"
  fi
  for i in $(seq 1 "$N"); do
    if [ "$MODE" = netns ]; then
      nodes+="NodeName=n$i NodeHostname=n$i NodeAddr=$NET.$((10 + i)) CPUs=$cpus RealMemory=$mem$gres State=UNKNOWN"$'\n'
    else
      nodes+="NodeName=n$i NodeHostname=n$i NodeAddr=127.0.0.$((10 + i)) Port=$((17010 + i)) CPUs=$cpus RealMemory=$mem$gres State=UNKNOWN"$'\n'
    fi
  done
  cat >"$CONF" <<EOF
# generated by slurm-testbed.sh ($MODE mode)
ClusterName=testbed
SlurmctldHost=$ctl_host($ctl_addr)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$TB/munge/munge.socket,cred_expire=${SLURM_TB_CRED_EXPIRE:-10}
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$TB/state.ctld
SlurmdSpoolDir=$TB/spool/%n
SlurmctldPidFile=$TB/run/slurmctld.pid
SlurmdPidFile=$TB/run/slurmd-%n.pid
SlurmctldLogFile=$TB/log/slurmctld.log
SlurmdLogFile=$TB/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$acct
JobCompType=jobcomp/filetxt
JobCompLoc=$TB/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a requeued job (or one whose begin time passed) starts within seconds, not at the next 30 s pass
SchedulerParameters=bf_interval=2
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmctldTimeout=30
# A cut node's job stays COMPLETING until slurmctld declares the node down: this long, plus up to a third
# of it to the next ping. 300 s is Slurm's default; 30 s keeps a recovery test's wait short, and a slurmd
# answers a ping in milliseconds even on a loaded bed.
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
$gresline
$nodes
PartitionName=debug Nodes=n[1-$N] Default=YES MaxTime=INFINITE State=UP
EOF
  {
    echo "127.0.0.1 localhost"
    if [ "$MODE" = netns ]; then
      echo "$NET.1 tbctl"
      for i in $(seq 1 "$N"); do echo "$NET.$((10 + i)) n$i"; done
    else
      echo "127.0.0.1 tbctl"
      for i in $(seq 1 "$N"); do echo "127.0.0.$((10 + i)) n$i"; done
    fi
  } >"$TB/hosts"
}

write_wrappers() {
  mkdir -p "$TB/bin"; rm -f "$TB/bin"/*
  local c
  for c in sbatch srun salloc squeue scancel scontrol sinfo sacct sacctmgr sreport sstat sattach sprio sshare sdiag strigger sbcast; do
    if [ "$MODE" = netns ]; then
      printf '#!/bin/sh\n# slurm-testbed: run %s on the "login node" (namespace %s)\nexport SLURM_CONF=%s\nexec nsenter --net=/run/netns/%s -- /usr/bin/%s "$@"\n' \
        "$c" "$NS_PREFIX-ctl" "$CONF" "$NS_PREFIX-ctl" "$c" >"$TB/bin/$c"
    else
      printf '#!/bin/sh\nexport SLURM_CONF=%s\nexec /usr/bin/%s "$@"\n' "$CONF" "$c" >"$TB/bin/$c"
    fi
    chmod 755 "$TB/bin/$c"
  done
}

# --- network namespaces ---------------------------------------------------------------------
make_netns() {
  local ctl=$NS_PREFIX-ctl i ns
  ip netns add "$ctl"
  ip -n "$ctl" link set lo up
  ip -n "$ctl" link add br0 type bridge
  ip -n "$ctl" addr add "$NET.1/24" dev br0
  ip -n "$ctl" link set br0 up
  for i in $(seq 1 "$N"); do
    ns=$NS_PREFIX-n$i
    ip netns add "$ns"
    ip -n "$ctl" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$ctl" link set "v$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}
# start a command with host name $2 and $TB/hosts as /etc/hosts (own UTS + mount namespace),
# inside network namespace $1 (netns mode) or in the root one ($1 empty, multi mode)
ns_start() {
  local ns=$1 host=$2 enter=(); shift 2
  [ -n "$ns" ] && enter=(nsenter --net="/run/netns/$ns" --)
  "${enter[@]}" unshare --uts --mount --propagation private -- \
    sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' sh "$host" "$TB/hosts" "$@"
}

# --- accounting database (optional) ---------------------------------------------------------
start_dbd() {  # MariaDB on 127.0.0.1:$DB_PORT of the controller's namespace, then slurmdbd
  local ns=$1 D=$TB/db enter=() ok=0
  [ -n "$ns" ] && enter=(nsenter --net="/run/netns/$ns" --)
  mariadb-install-db --no-defaults --datadir="$D/data" --user=root --skip-test-db \
    --auth-root-authentication-method=socket >"$TB/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed, see $TB/log/mariadb-install.log"
  "${enter[@]}" setsid mariadbd --no-defaults --datadir="$D/data" --socket="$D/mysqld.sock" \
    --pid-file="$TB/run/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --user=root \
    --skip-name-resolve --innodb-buffer-pool-size=32M --log-error="$TB/log/mariadb.log" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 150); do mariadb-admin --no-defaults -S "$D/mysqld.sock" -u root ping >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  [ $ok = 1 ] || die "MariaDB did not come up, see $TB/log/mariadb.log"
  mariadb --no-defaults -S "$D/mysqld.sock" -u root -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$D/pass")'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  ns_start "$ns" tbctl env SLURM_CONF="$CONF" slurmdbd
  ok=0
  for _ in $(seq 150); do
    SLURM_CONF=$CONF "${enter[@]}" timeout 5 sacctmgr -n show cluster format=cluster >/dev/null 2>&1 && { ok=1; break; }; sleep 0.2
  done
  [ $ok = 1 ] || die "slurmdbd did not come up, see $TB/log/slurmdbd.log"
  SLURM_CONF=$CONF "${enter[@]}" timeout 10 sacctmgr -i add cluster testbed >/dev/null || die "sacctmgr add cluster failed"
  local acct=${SLURM_TB_ACCOUNT:-testlab} users
  users=$(echo "root,${SLURM_TB_USERS:-}" | sed 's/,*$//')
  SLURM_CONF=$CONF "${enter[@]}" timeout 10 sacctmgr -i add account "$acct" cluster=testbed >/dev/null || die "sacctmgr add account failed"
  SLURM_CONF=$CONF "${enter[@]}" timeout 10 sacctmgr -i add user "$users" account="$acct" >/dev/null || die "sacctmgr add user failed"
}

# /etc/slurm/slurm.conf -> the test bed's, unless a file that is not our link is there
link_default_conf() {
  local etc=/etc/slurm/slurm.conf
  if [ -L "$etc" ] || [ ! -e "$etc" ]; then mkdir -p /etc/slurm; ln -sfn "$CONF" "$etc"; fi
}
unlink_default_conf() {
  local etc=/etc/slurm/slurm.conf
  if [ -L "$etc" ] && [ "$(readlink "$etc")" = "$CONF" ]; then rm -f "$etc"; fi
}

# --- up / down ------------------------------------------------------------------------------
do_down() {
  load_state
  local i ns pids
  if [ "$MODE" = multi ] && alive "$(pidof_file "$TB/run/slurmctld.pid")" "$CONF"; then
    # no namespace to empty: cancel the jobs so their steps end before the daemons go
    SLURM_CONF=$CONF scancel --quiet $(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for i in $(seq 1 64); do kill_pidfile "$TB/run/slurmd-n$i.pid" "$CONF"; done
  kill_pidfile "$TB/run/slurmctld.pid" "$CONF"
  kill_pidfile "$TB/run/slurmdbd.pid" slurmdbd
  kill_pidfile "$TB/run/mariadbd.pid" "$TB/db"
  # whatever is left of ours (slurmstepd, job tasks, srun/sbatch clients in the namespaces)
  pids=$(our_pids)
  if [ -n "$pids" ]; then
    kill $pids 2>/dev/null || true
    for _ in $(seq 30); do pids=$(our_pids); [ -z "$pids" ] && break; sleep 0.1; done
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  fi
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NS_PREFIX-(n[0-9]+|ctl)$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  kill_pidfile "$TB/munge/munged.pid" "$TB/munge"
  rm -f "$TB/munge/munge.socket" "$TB/munge/munge.socket.lock"
  unlink_default_conf
}

# The daemons outlive this script: they must not keep what its caller had open (a lock file
# held with `flock FILE make test` would stay held by munged and slurmdbd until `down`).
close_inherited_fds() {
  local fd
  for fd in $(ls /proc/$$/fd); do
    [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
  done
  return 0
}

do_up() {
  close_inherited_fds
  local want_mode=${SLURM_TB_MODE:-multi} want_n=${1:-${SLURM_TB_NODES:-3}} want_dbd=${SLURM_TB_DBD:-0}
  case "$want_mode" in netns|multi) ;; *) die "SLURM_TB_MODE must be netns or multi";; esac
  [[ "$want_n" =~ ^[0-9]+$ ]] && [ "$want_n" -ge 1 ] && [ "$want_n" -le 64 ] || die "node count must be 1..64"
  mkdir -p "$TB"; chmod 755 "$TB"
  if healthy && [ "$MODE" = "$want_mode" ] && [ "$N" = "$want_n" ] && [ "$DBD" = "$want_dbd" ]; then
    link_default_conf
    log "slurm-testbed: already up ($MODE, $N nodes$([ "$DBD" = 1 ] && echo ", slurmdbd"))"; print_env; return 0
  fi
  do_down   # whatever was there (a half-started or differently shaped cluster) goes first
  MODE=$want_mode; N=$want_n; DBD=$want_dbd
  install_pkgs
  UP_STARTED=1
  local t0; t0=$(date +%s.%N)
  rm -rf "$TB/state.ctld" "$TB/spool" "$TB/run" "$TB/log" "$TB/etc" "$TB/bin" "$TB/db"
  mkdir -p "$TB/state.ctld" "$TB/run" "$TB/log" "$TB/etc" "$TB/munge"
  for i in $(seq 1 "$N"); do mkdir -p "$TB/spool/n$i"; done
  printf 'MODE=%s\nN=%s\nDBD=%s\n' "$MODE" "$N" "$DBD" >"$TB/state"
  if [ "$MODE" = netns ]; then DB_PORT=3306; else DB_PORT=16306; fi
  if [ "$DBD" = 1 ]; then mkdir -p "$TB/db"; (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$TB/db/pass"); fi
  write_conf; write_wrappers; link_default_conf

  # munge: private key and socket (munged insists on a 0755 socket dir and a 0600 key)
  chmod 755 "$TB/munge"
  [ -s "$TB/munge/munge.key" ] || mungekey -c -k "$TB/munge/munge.key" >/dev/null
  chmod 600 "$TB/munge/munge.key"
  munged -S "$TB/munge/munge.socket" --key-file="$TB/munge/munge.key" --log-file="$TB/munge/munged.log" \
    --pid-file="$TB/munge/munged.pid" --seed-file="$TB/munge/munged.seed"
  munge -S "$TB/munge/munge.socket" -n | unmunge -S "$TB/munge/munge.socket" >/dev/null || die "munge self-test failed, see $TB/munge/munged.log"

  local ctl_ns=""
  if [ "$MODE" = netns ]; then make_netns; ctl_ns=$NS_PREFIX-ctl; fi
  [ "$DBD" = 1 ] && start_dbd "$ctl_ns"
  ns_start "$ctl_ns" tbctl slurmctld -f "$CONF"
  for _ in $(seq 100); do client scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  client scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld did not come up, see $TB/log/slurmctld.log"
  local t1; t1=$(date +%s.%N)

  for i in $(seq 1 "$N"); do
    if [ "$MODE" = netns ]; then ns_start "$NS_PREFIX-n$i" "n$i" slurmd -f "$CONF" -N "n$i"
    else ns_start "" "n$i" slurmd -f "$CONF" -N "n$i"; fi
  done
  local idle=0
  for _ in $(seq 300); do
    idle=$(client sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$' || true)
    [ "$idle" = "$N" ] && break; sleep 0.1
  done
  [ "$idle" = "$N" ] || { client sinfo -N -l >&2 || true; die "only $idle/$N nodes idle after 30 s, see $TB/log/"; }
  local t2; t2=$(date +%s.%N)
  UP_STARTED=0
  log "slurm-testbed: up ($MODE, $N nodes$([ "$DBD" = 1 ] && echo ', slurmdbd')); slurmctld ready in $(awk "BEGIN{printf \"%.2f\", $t1-$t0}") s, all nodes idle in $(awk "BEGIN{printf \"%.2f\", $t2-$t0}") s"
  print_env
}

case "$cmd" in
  up) shift; do_up "${1:-}";;
  down) do_down; log "slurm-testbed: down";;
  status)
    if healthy; then log "slurm-testbed: up ($MODE, $N nodes$([ "$DBD" = 1 ] && echo ", slurmdbd"))"; client sinfo -N; else log "slurm-testbed: down"; exit 1; fi;;
  env) load_state; print_env;;
  check)
    healthy || die "not up (run: $0 up)"
    [ "$N" -ge 2 ] || die "check needs at least 2 nodes"
    out=$(client srun -N 2 -n 4 -l hostname | sort) || die "srun -N 2 -n 4 hostname failed"
    echo "$out"
    [ "$(echo "$out" | awk '{print $2}' | sort -u | wc -l)" = 2 ] || die "srun did not span 2 hosts"
    mkdir -p "$TB/check"; rm -f "$TB/check/out"
    client sbatch --wait -N 2 -o "$TB/check/out" --wrap 'srun --ntasks-per-node=1 sh -c "echo step \$SLURM_NODEID on \$(hostname)"' >/dev/null \
      || die "sbatch --wait -N 2 failed, see $TB/check/out"
    sort "$TB/check/out"
    [ "$(grep -c '^step ' "$TB/check/out")" = 2 ] && [ "$(awk '/^step /{print $4}' "$TB/check/out" | sort -u | wc -l)" = 2 ] \
      || die "batch step did not span 2 hosts"
    log "slurm-testbed: check passed";;
  node-kill)
    load_state; node=${2:-}; [ -n "$node" ] || die "usage: $0 node-kill nX"
    pid=$(pidof_file "$TB/run/slurmd-$node.pid")
    alive "$pid" "$CONF" || die "slurmd of $node is not running"
    uts=$(readlink "/proc/$pid/ns/uts")
    [ "$uts" != "$(readlink /proc/self/ns/uts)" ] || die "slurmd of $node shares this UTS namespace"
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/uts" 2>/dev/null)" = "$uts" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
    done
    rm -f "$TB/run/slurmd-$node.pid"
    log "slurm-testbed: $node cut off (slurmd $pid and its namespace's processes killed)";;
  node-start)
    load_state; node=${2:-}; i=${node#n}; [ -n "$node" ] && [ "$i" != "$node" ] || die "usage: $0 node-start nX"
    if ! alive "$(pidof_file "$TB/run/slurmd-$node.pid")" "$CONF"; then
      close_inherited_fds
      if [ "$MODE" = netns ]; then ns_start "$NS_PREFIX-$node" "$node" slurmd -f "$CONF" -N "$node"
      else ns_start "" "$node" slurmd -f "$CONF" -N "$node"; fi
    fi
    for _ in $(seq 300); do
      st=$(client sinfo -h -N -n "$node" -o '%T' 2>/dev/null || true)
      case "$st" in idle|allocated|mixed) break;; esac; sleep 0.1
    done
    case "$st" in idle|allocated|mixed) log "slurm-testbed: $node is $st";; *) die "$node is '$st' 30 s after its slurmd started";; esac;;
  exec)
    shift; [ $# -gt 0 ] || die "usage: slurm-testbed.sh exec CMD [ARGS...]"
    load_state
    if [ "$MODE" = netns ]; then
      SLURM_CONF=$CONF PATH="$TB/bin:$PATH" exec nsenter --net="/run/netns/$NS_PREFIX-ctl" -- unshare --mount --propagation private -- \
        sh -c 'mount --bind "$1" /etc/hosts && shift && exec "$@"' sh "$TB/hosts" "$@"
    else
      SLURM_CONF=$CONF PATH="$TB/bin:$PATH" exec unshare --mount --propagation private -- \
        sh -c 'mount --bind "$1" /etc/hosts && shift && exec "$@"' sh "$TB/hosts" "$@"
    fi;;
  *) die "usage: slurm-testbed.sh up [N] | down | status | env | check | node-kill nX | node-start nX | exec CMD...";;
esac
