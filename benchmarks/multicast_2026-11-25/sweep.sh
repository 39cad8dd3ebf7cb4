#!/usr/bin/env bash
# The multicast all-gather against the rack-ordered ring, on emulated clusters; one
# `commpress bench` invocation per network. Run as root from the repository root:
#   [OUT=DIR] bash benchmarks/multicast_2026-11-25/sweep.sh [NAME...]   (default: every network)
set -euo pipefail
here=${OUT:-benchmarks/multicast_2026-11-25}  # OUT=DIR writes there instead
bench() {  # NAME, then commpress bench arguments
  local name=$1; shift
  echo "== $name: commpress bench $*" >&2
  commpress bench --prefix mcb --op all_gather -w 1 -n 5 \
    --json "$here/$name.json" --markdown "$here/$name.md" "$@" > "$here/$name.txt"
}
declare -A runs=(
  [racks_1g_500m_mtu1500]="--hosts 8 --racks 2 --link 1gbit --uplink 500mbit --mtu 1500 -b 4M -e 64M -f 2 --algorithm native,ring,multicast --codec none,int8"
  [racks_1g_500m_mtu9000]="--hosts 8 --racks 2 --link 1gbit --uplink 500mbit --mtu 9000 -b 4M -e 64M -f 2 --algorithm native,ring,multicast --codec none,int8"
  [racks_200m_100m_mtu1500]="--hosts 8 --racks 2 --link 200mbit --uplink 100mbit --mtu 1500 -b 4M -e 64M -f 4 --algorithm ring,multicast --codec none,int8"
  [racks_200m_100m_mtu9000]="--hosts 8 --racks 2 --link 200mbit --uplink 100mbit --mtu 9000 -b 4M -e 64M -f 4 --algorithm ring,multicast --codec none,int8"
  [racks_1g_1g_mtu9000]="--hosts 8 --racks 2 --link 1gbit --uplink 1gbit --mtu 9000 -b 4M -e 64M -f 4 --algorithm ring,multicast --codec none,int8"
  [racks_1g_2g_mtu9000]="--hosts 8 --racks 2 --link 1gbit --uplink 2gbit --mtu 9000 -b 4M -e 64M -f 4 --algorithm ring,multicast --codec none,int8"
  [switch4_1g_mtu9000]="--hosts 4 --link 1gbit --mtu 9000 -b 4M -e 64M -f 2 --algorithm native,ring,multicast --codec none,int8"
  [switch8_1g_mtu9000]="--hosts 8 --link 1gbit --mtu 9000 -b 4M -e 64M -f 4 --algorithm native,ring,multicast --codec none,int8"
  [switch4_1g_mtu9000_roots4]="--hosts 4 --link 1gbit --mtu 9000 -b 4M -e 64M -f 4 --roots 4 --algorithm ring,multicast --codec none,int8"
  [switch8_1g_mtu9000_roots8]="--hosts 8 --link 1gbit --mtu 9000 -b 4M -e 64M -f 4 --roots 8 --algorithm ring,multicast --codec none,int8"
  [switch4_1g_mtu1500]="--hosts 4 --link 1gbit --mtu 1500 -b 4M -e 64M -f 4 --algorithm ring,multicast --codec none,int8"
)
order=(racks_1g_500m_mtu1500 racks_1g_500m_mtu9000 racks_200m_100m_mtu1500 racks_200m_100m_mtu9000
       racks_1g_1g_mtu9000 racks_1g_2g_mtu9000 switch4_1g_mtu9000 switch8_1g_mtu9000
       switch4_1g_mtu9000_roots4 switch8_1g_mtu9000_roots8 switch4_1g_mtu1500)
for name in "${@:-${order[@]}}"; do
  # shellcheck disable=SC2086
  bench "$name" ${runs[$name]}
done
