#!/usr/bin/env bash
# MPICH Hydra's "ssh" for the emulated cluster (scripts/cluster.sh): called as `cluster-launch.sh [ssh options]
# HOST COMMAND...`, it runs COMMAND on HOST by entering that host's namespaces, as ssh would log in there.
# Open MPI: pass it as --mca plm_rsh_agent scripts/cluster-launch.sh (docs/cluster.md).
set -euo pipefail
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
    case "$1" in
        -p|-l|-o|-i|-F) shift 2 ;;   # ssh options that take a value
        *) shift ;;
    esac
done
[ $# -ge 2 ] || { echo "cluster-launch.sh: usage: cluster-launch.sh HOST COMMAND..." >&2; exit 255; }
host=$1; shift
NAME=${CLUSTER_NAME:-gdc}
pid=$(cat "/run/gnn-dist-cluster/$NAME/$host.pid" 2>/dev/null) || {
    echo "cluster-launch.sh: no host $host in the emulated cluster $NAME" >&2; exit 255; }
kill -0 "$pid" 2>/dev/null || { echo "cluster-launch.sh: host $host is down" >&2; exit 255; }
# The host's memory cgroup (cluster.sh up --memory), or the cluster's: what runs there counts against it, not
# against the host it was launched from.
group=$(cat "/run/gnn-dist-cluster/$NAME/$host.cgroup" 2>/dev/null || \
        cat "/run/gnn-dist-cluster/$NAME/base.cgroup" 2>/dev/null || true)
[ -n "$group" ] && [ -d "$group" ] && echo $$ > "$group/cgroup.procs"
# As ssh does: the words form one command line for the remote shell.
exec nsenter --target "$pid" --net --uts --ipc --mount --pid --wd="$PWD" -- /bin/sh -c "$*"
