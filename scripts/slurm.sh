#!/usr/bin/env bash
# A one-host Slurm cluster for the multi-node tests: install Debian's slurm-wlm and munge when
# missing, start munged, slurmctld and slurmd (one node, 2 CPUs) on loopback, print the path of
# its slurm.conf (export it as SLURM_CONF so srun/sbatch/squeue find the cluster).
#   scripts/slurm.sh start [DIR]   -> prints DIR/slurm.conf once `sinfo` shows the node idle
#   scripts/slurm.sh stop  [DIR]
# Fails loudly (exit 1) when Slurm cannot be installed or started: never a silent skip.
set -euo pipefail
action="${1:-start}"
dir="${2:-${TMPDIR:-/tmp}/ember-slurm}"
port="${EMBER_SLURM_PORT:-56817}"   # slurmctld; slurmd takes the next one
cpus="${EMBER_SLURM_CPUS:-2}"      # the tests start 2 tasks; config_overrides allows it on 1 core

die() { echo "scripts/slurm.sh: ERROR: $*" >&2; exit 1; }

alive() {  # a running process; an exited daemon whose parent never reaps it (a zombie) is not
    [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* (.*) Z ' "/proc/$1/stat" 2>/dev/null
}

stop_daemons() {
    local name pid
    for name in slurmd slurmctld munged; do
        [ -f "$dir/$name.pid" ] || continue
        pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && alive "$pid"; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
            if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
        fi
    done
}

case "$action" in
start)
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null \
        || ! command -v munged >/dev/null; then
        echo "scripts/slurm.sh: installing slurm-wlm and munge from Debian's packages" >&2
        [ "$(id -u)" = 0 ] || die "Slurm is not installed and installing it needs root"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null) \
            || die "apt-get install slurm-wlm munge failed"
    fi
    [ "$(id -u)" = 0 ] || die "slurmd must run as root (it starts every job's processes as their user)"
    stop_daemons
    rm -rf "$dir"
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    host=$(hostname -s)
    # munged with a key of its own and its socket in DIR: the system's munge (if any) is left alone.
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 700 "$dir/munge"; chmod 400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed" \
        || die "munged did not start: $(tail -5 "$dir/munged.log" 2>/dev/null)"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=ember
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdParameters=config_overrides
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=ember Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -i -f "$dir/slurm.conf" || die "slurmctld did not start: $(tail -5 "$dir/slurmctld.log" 2>/dev/null)"
    slurmd -f "$dir/slurm.conf" || die "slurmd did not start: $(tail -5 "$dir/slurmd.log" 2>/dev/null)"
    for _ in $(seq 60); do
        state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
        case "$state" in idle*) echo "$dir/slurm.conf"; exit 0 ;; esac
        sleep 0.5
    done
    die "the node $host did not become idle (sinfo says '${state:-nothing}'): $(tail -5 "$dir/slurmctld.log" 2>/dev/null) $(tail -5 "$dir/slurmd.log" 2>/dev/null)"
    ;;
stop)
    stop_daemons
    rm -rf "$dir"
    ;;
*)
    die "usage: scripts/slurm.sh start|stop [DIR]"
    ;;
esac
