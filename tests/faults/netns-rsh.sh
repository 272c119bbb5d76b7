#!/bin/sh
# plm_rsh_agent for the multi-host test: mpirun calls it like ssh, "netns-rsh.sh HOST COMMAND...";
# HOST is an address of the test's veth network and PF_NETNS_MAP ("addr=namespace ...") names the
# namespace that plays that host. The command runs there through a shell, as ssh would run it.
host="$1"; shift
for pair in $PF_NETNS_MAP; do
  if [ "${pair%%=*}" = "$host" ]; then exec ip netns exec "${pair#*=}" sh -c "$*"; fi
done
echo "netns-rsh: no namespace for host '$host' in PF_NETNS_MAP" >&2
exit 255
