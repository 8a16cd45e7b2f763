#!/usr/bin/env bash
# Simulated hosts on one Linux machine, to try multi-node data-parallel training without a cluster.
#
#   sudo tools/simulate_hosts.sh up N      # N hosts: network namespaces ds2h0..ds2h<N-1>
#   sudo tools/simulate_hosts.sh down      # remove them all
#   tools/simulate_hosts.sh status
#
# Each host is a network namespace with its own interface and private address (10.77.0.1, 10.77.0.2, ...)
# joined by a bridge (ds2br0, 10.77.0.254 on this machine's side), and its own sshd listening on that
# address only.  The processes of two hosts talk over distinct interfaces and addresses, not 127.0.0.1; they
# share this machine's filesystem (as hosts with a shared filesystem do), so the working tree and its
# environments are at the same path everywhere.  `up` writes, in $DS2_SIM_DIR (default /run/ds2-hosts):
#   hostfile     one "ADDRESS:1" line per host, for run_all.py --hosts
#   ssh_config   for run_all.py --ssh "-F $DS2_SIM_DIR/ssh_config" (a key of its own, no host-key prompts)
# Then:  python run_all.py --preset smoke --frameworks pytorch,jax --workers 2 \
#            --hosts /run/ds2-hosts/hostfile --ssh "-F /run/ds2-hosts/ssh_config"
# Needs root, iproute2 and OpenSSH's server (Debian: apt-get install openssh-server).
# Exit status: 0 done; 2 bad input (one line naming the argument, before anything is made or removed).
set -euo pipefail
BRIDGE=ds2br0
PREFIX=10.77.0
MAX_HOSTS=50    # 10.77.0.1..50 on one /24 bridge, each host an sshd and a namespace: well past any test's need

die() { echo "simulate_hosts.sh: error: $*" >&2; exit 2; }

# ---- the arguments and DS2_SIM_DIR, checked before anything is made or removed -----------------------------------
usage="simulate_hosts.sh up N | down | status"
[ $# -ge 1 ] || die "no command; usage: $usage"
case "$1" in
    up)
        [ $# -ge 2 ] || die "up N: N, the number of hosts, is missing; give 1 to $MAX_HOSTS"
        [ $# -eq 2 ] || die "up N takes one argument, got $(($# - 1)): '${*:2}'"
        # digits only, no leading zero (bash would read 08 as octal), at most 2 digits (no overflow): then compare
        [[ "$2" =~ ^[1-9][0-9]?$ ]] && [ "$2" -le "$MAX_HOSTS" ] \
            || die "up N: N is a number of hosts, 1 to $MAX_HOSTS, written without leading zeros; got '$2'";;
    down|status)
        [ $# -eq 1 ] || die "$1 takes no argument, got '${*:2}'";;
    *) die "unknown command '$1'; usage: $usage";;
esac
if [ -n "${DS2_SIM_DIR+set}" ]; then   # `down` removes this directory: it must be one `up` made, or new
    [ -n "$DS2_SIM_DIR" ] || die "DS2_SIM_DIR is set but empty; unset it (default /run/ds2-hosts) or name a directory"
    [[ "$DS2_SIM_DIR" == /* ]] || die "DS2_SIM_DIR=$DS2_SIM_DIR: expected an absolute path (default /run/ds2-hosts)"
fi
DIR=${DS2_SIM_DIR:-/run/ds2-hosts}
if [ -e "$DIR" ] && ! { [ -d "$DIR" ] && { [ -e "$DIR/.ds2-simulated-hosts" ] || [ -e "$DIR/hostfile" ] \
        || [ -z "$(ls -A "$DIR")" ]; }; }; then
    die "DS2_SIM_DIR=$DIR exists and is not a directory this script made (no .ds2-simulated-hosts in it): it is kept; name a new one"
fi
need_root() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces and an sshd per host): run it with sudo"
    command -v ip >/dev/null || die "ip (iproute2) not found"
}
hosts() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ds2h[0-9]+$' | sort -V || true; }

down() {
    need_root
    for ns in $(hosts); do
        i=${ns#ds2h}
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip link del "ds2v$i" 2>/dev/null || true
        ip netns del "$ns"
        rm -rf "/etc/netns/$ns"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$DIR"
}

up() {
    local n=$1
    need_root
    local sshd; sshd=$(command -v sshd || echo /usr/sbin/sshd)
    [ -x "$sshd" ] || die "sshd not found (Debian/Ubuntu: apt-get install openssh-server)"
    down
    mkdir -p "$DIR" /run/sshd
    chmod 700 "$DIR"
    : > "$DIR/.ds2-simulated-hosts"       # what `down` and the next `up` recognise as this script's
    ssh-keygen -q -t ed25519 -N "" -f "$DIR/id_ed25519" -C ds2-simulated-hosts
    ssh-keygen -q -t ed25519 -N "" -f "$DIR/host_ed25519"
    cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
    ip link add "$BRIDGE" type bridge
    ip addr add "$PREFIX.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    : > "$DIR/hostfile"
    local names="127.0.0.1 localhost"$'\n'
    for ((i = 0; i < n; i++)); do names+="$PREFIX.$((i + 1)) ds2h$i"$'\n'; done
    for ((i = 0; i < n; i++)); do
        local ns=ds2h$i addr=$PREFIX.$((i + 1))
        # its own /etc/hosts (ip netns exec bind-mounts /etc/netns/NS/hosts) and, below, its own hostname (a UTS
        # namespace): its name resolves to its own address, as a real host's does
        mkdir -p "/etc/netns/$ns"
        printf '%s' "$names" > "/etc/netns/$ns/hosts"
        ip netns add "$ns"
        ip link add "ds2v$i" type veth peer name eth0 netns "$ns"
        ip link set "ds2v$i" master "$BRIDGE" up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" \
            "$sshd" -o ListenAddress="$addr" -o HostKey="$DIR/host_ed25519" \
            -o PidFile="$DIR/sshd-$i.pid" -o AuthorizedKeysFile="$DIR/authorized_keys" \
            -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no -o UsePAM=no \
            -o StrictModes=no -o MaxStartups=100 -o MaxSessions=100 -o AcceptEnv=none
        echo "$addr:1" >> "$DIR/hostfile"
    done
    cat > "$DIR/ssh_config" <<EOF
Host $PREFIX.*
    IdentityFile $DIR/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
    User root
EOF
    for ((i = 0; i < n; i++)); do      # each sshd answers before we say so
        local ok=
        for _ in $(seq 50); do
            if ssh -F "$DIR/ssh_config" -o ConnectTimeout=2 "$PREFIX.$((i + 1))" true 2>/dev/null; then ok=1; break; fi
            sleep 0.1
        done
        [ -n "$ok" ] || die "the sshd of ds2h$i ($PREFIX.$((i + 1))) does not answer"
    done
    echo "$n simulated host(s) up: $(tr '\n' ' ' < "$DIR/hostfile")"
    echo "hostfile: $DIR/hostfile; ssh options: --ssh \"-F $DIR/ssh_config\""
}

case "$1" in
    up) up "$2";;
    down) down; echo "simulated hosts removed";;
    status) for ns in $(hosts); do echo "$ns: $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}'), \
$(ip netns pids "$ns" | wc -l) process(es)"; done;;
esac
