#!/usr/bin/env bash
# Run "$@" in a cpuacct cgroup of its own (cgroup v1, as root) and print its total CPU
# seconds: every process it starts, fork-server children included.
group=/sys/fs/cgroup/cpuacct/cpu_of_$$
mkdir -p "$group"
bash -c 'echo $$ > "$1/tasks"; shift; exec "$@"' _ "$group" "$@"
status=$?
python3 -c "print('cpu_s', round(int(open('$group/cpuacct.usage').read()) / 1e9, 2))"
for _ in $(seq 20); do  # the last processes (a fork server) leave the group
    rmdir "$group" 2>/dev/null && break
    sleep 0.5
done
exit $status
