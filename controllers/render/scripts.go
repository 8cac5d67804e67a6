package render

import (
	"fmt"

	"github.com/keyroll/keyroll/apis/v1beta1"
)

// What runs in a Redis container: the start script (in the ConfigMap).

// startScript starts Redis as the primary or as a replica of it, whichever the cluster needs. It
// asks the other pods (the peers file, as the probe user) who the primary is, and replicates from
// it, authenticating as the replication user (a primary has that credential too, for when it
// becomes a replica), whose password reaches redis.conf only as \xHH escapes (so no character of
// it needs care). When no pod says it is the primary, but some answer
// as replicas: of this pod (it was the primary and stopped), it starts as a replica of one of
// them, which have its latest writes, and keyroll makes the best of them the primary (a primary
// that started again empty, or from an older snapshot, would take its replicas' data with it);
// of another pod, it follows them. When no pod answers (a new cluster, or every pod restarts),
// pod 0 is the primary, with what its disk holds. keyroll points the nodes at the primary
// it keeps, whatever the script chose. The users come from the aclfile the pod mounts; while
// Redis runs keyroll changes them live and never reloads the file. The script starts again in the
// same pod as the first time (a crashed Redis container is restarted in place, with the run
// directory of its first start): it replaces runtime.conf, which it left read-only. SIGTERM goes
// on to Redis.
func startScript(rc *v1beta1.RedisCluster) string {
	return fmt.Sprintf(`#!/bin/sh
set -eu
rm -f %[1]s/runtime.conf
: > %[1]s/runtime.conf
me="$POD_NAME.%[5]s"
probe="$(cat %[2]s/%[9]s)"
primary="" hint="" answered=""
while read -r peer port; do
  [ "$peer" = "$me" ] && continue
  info="$(REDISCLI_AUTH="$probe" timeout 3 redis-cli --no-auth-warning%[11]s --user %[10]s -h "$peer" -p "$port" info replication 2>/dev/null < /dev/null | tr -d '\r')" || true
  case "$info" in *role:*) answered="$peer $port" ;; *) continue ;; esac
  case "$info" in *role:master*) primary="$peer $port"; break ;; esac
  host="$(printf '%%s\n' "$info" | sed -n 's/^master_host://p')"
  [ -n "$host" ] && hint="$host $(printf '%%s\n' "$info" | sed -n 's/^master_port://p')"
done < %[8]s/peers
if [ -z "$primary" ] && [ -n "$answered" ]; then
  case "${hint%% *}" in
    # This pod was the primary: its replicas have its latest writes, which its disk may not.
    "$me" | "$POD_NAME" | "${POD_IP:-}") primary="$answered" ;;
    *) primary="${hint:-$answered}" ;;
  esac
elif [ -z "$primary" ] && [ "${POD_NAME##*-}" != "0" ]; then
  primary="%[4]s-0.%[5]s %[6]d"
fi
# Every node can be made a replica later (FAILOVER, keyroll's REPLICAOF): each has the
# replication user's credential.
pass="$(od -An -v -tx1 %[2]s/%[3]s | tr -d ' \n' | sed 's/../\\x&/g')"
{
  echo "masteruser %[7]s"
  echo "masterauth \"$pass\""
} > %[1]s/runtime.conf
if [ -n "$primary" ]; then
  echo "keyroll: starting as a replica of $primary"
  echo "replicaof $primary" >> %[1]s/runtime.conf
else
  echo "keyroll: starting as the primary"
fi
chmod 0400 %[1]s/runtime.conf
redis-server %[8]s/redis.conf &
redis=$!
trap 'kill -TERM "$redis" 2>/dev/null || true' TERM INT
status=0
wait "$redis" || status=$?
if [ "$status" -gt 128 ]; then
  # wait was interrupted by the signal passed on to Redis: wait for Redis itself, whose status is
  # the pod's (0 after a clean shutdown).
  status=0
  wait "$redis" || status=$?
fi
exit "$status"
`, runDir, aclMountDir, ReplicationPasswordKey, rc.Name, HeadlessServiceName(rc), RedisPort, ReplicationUser, configMountDir, ProbePasswordKey, ProbeUser, redisCLITLS(rc))
}
