#!/usr/bin/env bash
# An emulated cluster on this machine: N "hosts", each with its own network, hostname (UTS), mount, IPC and PID
# namespaces, joined by a bridge through links shaped with tbf. Needs root, ip, tc, unshare and nsenter.
#
#   scripts/cluster.sh up N [--rate 1gbit] [--name gdc] [--memory HOST=SIZE ...]
#                                                         build hosts gdc-h0 .. gdc-h{N-1} (10.77.0.1 ..); --memory
#                                                         gives a host less memory than the machine's: a memory
#                                                         cgroup of SIZE that its processes join (as a container's
#                                                         or a SLURM job's limit)
#   scripts/cluster.sh exec HOST CMD...                   run CMD on HOST (a login shell there, as ssh would)
#   scripts/cluster.sh mpiexec [MPIEXEC OPTIONS]          MPICH's mpiexec, its control on h0, ranks launched on
#                                                         the hosts through scripts/cluster-launch.sh (-hosts or
#                                                         -f HOSTFILE as usual)
#   scripts/cluster.sh mpirun [MPIRUN OPTIONS]            Open MPI's mpirun (MPIRUN, default mpirun.openmpi) the same
#                                                         way: its daemons start through cluster-launch.sh
#   scripts/cluster.sh cut HOST | heal HOST               take HOST's link down, or up again
#   scripts/cluster.sh kill HOST                          kill every process on HOST (the host is lost)
#   scripts/cluster.sh killall HOST                       kill every process started on HOST; the host stays up
#   scripts/cluster.sh down [--name gdc]                  tear everything down (also done if `up` fails)
#   scripts/cluster.sh status
#
# What it creates, and nothing else: network namespaces NAME-switch (holding the bridge) and NAME-hN, a veth
# pair per host, addresses 10.77.0.0/24 inside those namespaces only (the machine's own network is not touched
# and no traffic leaves the bridge), /etc/netns/NAME-hN/hosts (ip netns exec's per-namespace /etc/hosts), and
# state under /run/gnn-dist-cluster/NAME. Each host's UTS, IPC, mount and PID namespaces are held by one
# `sleep` (PID 1 there) whose namespaces are entered with nsenter; the mount namespace sees the host's own
# /etc/hosts and /proc. MPI between two hosts therefore goes over TCP through the shaped link: with private
# IPC and PID namespaces, UCX cannot use shared memory or cross-memory attach across them (docs/cluster.md).
set -euo pipefail

NAME=${CLUSTER_NAME:-gdc}
SUBNET=10.77.0
STATE_ROOT=/run/gnn-dist-cluster
HERE="$(cd "$(dirname "$0")" && pwd)"

die() { echo "cluster.sh: $*" >&2; exit 2; }

parse_common() {
    RATE=1gbit
    ARGS=()
    MEMORY=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --rate) RATE=$2; shift 2 ;;
            --memory) MEMORY+=("$2"); shift 2 ;;
            --name) NAME=$2; shift 2 ;;
            *) ARGS+=("$1"); shift ;;
        esac
    done
}

state() { echo "$STATE_ROOT/$NAME"; }

hosts() { cat "$(state)/hosts" 2>/dev/null || true; }

holder_pid() {
    local pid
    pid=$(cat "$(state)/$1.pid" 2>/dev/null) || die "no host $1 in cluster $NAME (scripts/cluster.sh status)"
    kill -0 "$pid" 2>/dev/null || die "host $1 is down (its namespaces' holder $pid is gone)"
    echo "$pid"
}

cgroup_mounts() {  # shell commands that mount this machine's cgroup file systems again, as they are mounted here
    awk '$2 == "/sys/fs/cgroup" && $3 == "tmpfs" {print "mount -t tmpfs cgroup_root /sys/fs/cgroup;"}
         $3 == "cgroup" || $3 == "cgroup2" {
             n = split($4, opts, ","); keep = ""
             for (i = 1; i <= n; i++) if (opts[i] !~ /^(rw|ro|relatime|nosuid|nodev|noexec|seclabel)$/) keep = keep "," opts[i]
             printf "mkdir -p %s; mount -t %s -o %s %s %s;\n", $2, $3, (keep == "" ? "defaults" : substr(keep, 2)), $3, $2
         }' /proc/mounts | tr '\n' ' '
}

own_memory_cgroup() {  # the directory of this process's memory cgroup (v2, or v1's memory controller)
    local own
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        own=$(awk -F: '$2 == "" {print $3}' /proc/self/cgroup)
        echo "/sys/fs/cgroup${own%/}"
    elif [ -d /sys/fs/cgroup/memory ]; then
        own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
        echo "/sys/fs/cgroup/memory${own%/}"
    fi
}

make_cgroup() {  # make_cgroup HOST SIZE: a memory cgroup for HOST below the cluster's own (memory.max or limit_in_bytes)
    local base dir
    base=$(cat "$(state)/base.cgroup" 2>/dev/null || true)
    [ -n "$base" ] && [ -d "$base" ] || die "--memory needs a memory cgroup controller"
    dir="$base/$NAME-$1"
    mkdir -p "$dir"
    if [ -f "$dir/memory.max" ]; then numfmt --from=iec "$2" > "$dir/memory.max"
    else numfmt --from=iec "$2" > "$dir/memory.limit_in_bytes"; fi
    echo "$dir" > "$(state)/$1.cgroup"
}

join_cgroup() {  # join_cgroup HOST: this process (and what it starts) counts against HOST's memory, if it has a
    # limit of its own, else against the cluster's (a process started from another host's must not stay in that one's)
    local dir
    dir=$(cat "$(state)/$1.cgroup" 2>/dev/null || cat "$(state)/base.cgroup" 2>/dev/null || true)
    [ -n "$dir" ] && [ -d "$dir" ] && echo $$ > "$dir/cgroup.procs"
    return 0
}

enter() {  # enter HOST CMD...: every namespace of HOST, in its working directory's equal
    local host=$1; shift
    local pid
    pid=$(holder_pid "$host")
    join_cgroup "$host"
    exec nsenter --target "$pid" --net --uts --ipc --mount --pid --wd="$PWD" -- "$@"
}

up() {
    parse_common "$@"
    set -- "${ARGS[@]}"
    local count=${1:-}
    [[ "$count" =~ ^[0-9]+$ ]] && [ "$count" -ge 1 ] && [ "$count" -le 200 ] || die "up N: give the number of hosts (1-200)"
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces and tc)"
    for tool in ip tc unshare nsenter; do command -v $tool >/dev/null || die "needs $tool"; done
    [ -e "$(state)" ] && die "cluster $NAME exists: scripts/cluster.sh down --name $NAME first"
    mkdir -p "$(state)"
    own_memory_cgroup > "$(state)/base.cgroup"
    trap 'echo "cluster.sh: up failed; tearing down" >&2; down_now' ERR
    ip netns add "$NAME-switch"
    ip -n "$NAME-switch" link add br0 type bridge
    ip -n "$NAME-switch" link set br0 up
    ip -n "$NAME-switch" link set lo up
    local hosts_file
    hosts_file="$(state)/etc-hosts"
    printf '127.0.0.1 localhost\n' > "$hosts_file"
    for i in $(seq 0 $((count - 1))); do
        printf '%s.%d %s-h%d\n' "$SUBNET" $((i + 1)) "$NAME" "$i" >> "$hosts_file"
    done
    for i in $(seq 0 $((count - 1))); do
        local host="$NAME-h$i"
        echo "$host" >> "$(state)/hosts"
        ip netns add "$host"
        ip link add "$NAME-v$i" type veth peer name "$NAME-p$i"
        ip link set "$NAME-v$i" netns "$host"
        ip link set "$NAME-p$i" netns "$NAME-switch"
        ip -n "$NAME-switch" link set "$NAME-p$i" master br0 up
        ip -n "$host" link set lo up
        ip -n "$host" link set "$NAME-v$i" name eth0
        ip -n "$host" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$host" link set eth0 up
        # Shape both directions: what a host sends (its eth0) and what it receives (the switch port).
        tc -n "$host" qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
        tc -n "$NAME-switch" qdisc add dev "$NAME-p$i" root tbf rate "$RATE" burst 256kb latency 50ms
        mkdir -p "/etc/netns/$host"
        cp "$hosts_file" "/etc/netns/$host/hosts"
        echo "$host" > "/etc/netns/$host/hostname"
        # The holder: PID 1 of the host's PID namespace, in its own UTS, IPC and mount namespaces (ip netns exec
        # has bind-mounted the host's /etc/hosts there); /proc is remounted for the new PID namespace, and the
        # cgroup file systems that ip netns exec's fresh /sys hides are mounted again (a process reads its memory
        # limit there).
        ip netns exec "$host" unshare --uts --ipc --mount --pid --fork --mount-proc --propagation private \
            sh -c "hostname $host; $(cgroup_mounts) exec sleep infinity" </dev/null >/dev/null 2>&1 &
        local outer=$!  # ip netns exec execs unshare, which forks the holder
        local holder=""
        for _ in $(seq 1 100); do
            holder=$(pgrep -P "$outer" -x sleep 2>/dev/null || true)
            [ -n "$holder" ] && break
            sleep 0.05
        done
        [ -n "$holder" ] || die "the holder of $host did not start"
        echo "$holder" > "$(state)/$host.pid"
    done
    echo "$RATE" > "$(state)/rate"
    for entry in "${MEMORY[@]+"${MEMORY[@]}"}"; do
        [[ "$entry" == *=* ]] || die "--memory HOST=SIZE, got $entry"
        grep -qx "${entry%%=*}" "$(state)/hosts" || die "--memory: no host ${entry%%=*}"
        make_cgroup "${entry%%=*}" "${entry#*=}"
    done
    trap - ERR
    echo "cluster $NAME up: $count hosts ($(hosts | tr '\n' ' ')) on $SUBNET.0/24, links shaped to $RATE"
}

down_now() {
    local host
    for host in $(hosts); do
        local pid
        pid=$(cat "$(state)/$host.pid" 2>/dev/null || true)
        # every process of the host's PID namespace dies with its PID 1
        [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
        ip netns del "$host" 2>/dev/null || true
        rm -rf "/etc/netns/$host"
        local group
        group=$(cat "$(state)/$host.cgroup" 2>/dev/null || true)
        if [ -n "$group" ] && [ -d "$group" ]; then
            for _ in $(seq 1 50); do rmdir "$group" 2>/dev/null && break; sleep 0.1; done
        fi
    done
    # hosts whose names never reached the state file (a failed up)
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-(h[0-9]+|switch)$" || true); do
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    rm -rf "$(state)"
}

down() {
    parse_common "$@"
    down_now
    echo "cluster $NAME down"
}

status() {
    parse_common "$@"
    [ -d "$(state)" ] || { echo "no cluster $NAME"; return 0; }
    echo "cluster $NAME, links $(cat "$(state)/rate" 2>/dev/null):"
    for host in $(hosts); do
        local pid
        pid=$(cat "$(state)/$host.pid" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            echo "  $host $(ip -n "$host" -4 -o addr show eth0 2>/dev/null | awk '{print $4}') up (holder $pid)"
        else
            echo "  $host down"
        fi
    done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    up) up "$@" ;;
    down) down "$@" ;;
    status) status "$@" ;;
    exec)
        [ $# -ge 2 ] || die "exec HOST CMD..."
        host=$1; shift
        enter "$host" "$@" ;;
    mpiexec)
        first=$(hosts | head -1)
        [ -n "$first" ] || die "no cluster $NAME: scripts/cluster.sh up N first"
        # mpiexec's control runs on h0 (its network, hostname and /etc/hosts: ip netns exec binds the host's
        # /etc/netns files) but in this PID namespace and with this /proc, so its launcher can enter any host's
        # namespaces (setns reaches only PID namespaces below the caller's).
        pid=$(holder_pid "$first")
        join_cgroup "$first"  # the ranks it starts on h0 itself count against h0's memory
        MPIEXEC=${MPIEXEC:-mpiexec}
        # shellcheck disable=SC2016
        exec ip netns exec "$first" sh -c "$(cgroup_mounts)"' exec "$@"' mpiexec \
            nsenter --target "$pid" --uts --wd="$PWD" -- \
            env CLUSTER_NAME="$NAME" "$MPIEXEC" -launcher ssh -launcher-exec "$HERE/cluster-launch.sh" "$@" ;;
    mpirun)
        # Open MPI's mpirun, placed as mpiexec above: its daemons reach the other hosts through cluster-launch.sh
        first=$(hosts | head -1)
        [ -n "$first" ] || die "no cluster $NAME: scripts/cluster.sh up N first"
        pid=$(holder_pid "$first")
        join_cgroup "$first"
        MPIRUN=${MPIRUN:-mpirun.openmpi}
        # shellcheck disable=SC2016
        exec ip netns exec "$first" sh -c "$(cgroup_mounts)"' exec "$@"' mpirun \
            nsenter --target "$pid" --uts --wd="$PWD" -- \
            env CLUSTER_NAME="$NAME" "$MPIRUN" --mca plm_rsh_agent "$HERE/cluster-launch.sh" "$@" ;;
    cut)
        [ $# -eq 1 ] || die "cut HOST"
        ip -n "$1" link set eth0 down ;;
    heal)
        [ $# -eq 1 ] || die "heal HOST"
        ip -n "$1" link set eth0 up ;;
    killall)
        [ $# -eq 1 ] || die "killall HOST"
        pid=$(holder_pid "$1")
        # from inside the host's PID namespace, kill -1 reaches every process there but its PID 1 (the holder)
        nsenter --target "$pid" --pid --mount -- sh -c 'kill -9 -1' || true ;;
    kill)
        [ $# -eq 1 ] || die "kill HOST"
        pid=$(holder_pid "$1")
        # PID 1 of the namespace: the kernel kills every other process in it too
        kill -9 "$pid" ;;
    *) die "usage: scripts/cluster.sh up N [--rate R] | exec HOST CMD | mpiexec ... | cut|heal|kill HOST | status | down" ;;
esac
