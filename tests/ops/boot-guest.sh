#!/bin/bash
# The inside of tests/ops/boot.test: runs in a Debian 12 container booted by systemd-nspawn,
# under systemd as PID 1, from the oneshot unit kvtest.service, as root.  /kvtest holds the
# packages (debs/) and boot-engine.c; /out is the test's directory, bind-mounted: this script
# writes one line per check to /out/results ("ok: ...", "FAIL: ...", "note: ..."), then
# "done", and powers the container off.  Its own output goes to /out/guest.log, the journal of
# the boot to /out/journal.txt.
set -uo pipefail
exec >>/out/guest.log 2>&1
export DEBIAN_FRONTEND=noninteractive
results=/out/results
sock=/run/kvpaged/kvpaged.sock
conf=/etc/kvpaged/kvpaged.conf
unit=/lib/systemd/system/kvpaged.service

ok() { echo "ok: $*" | tee -a "$results"; }
bad() { echo "FAIL: $*" | tee -a "$results"; }
note() { echo "note: $*" | tee -a "$results"; }
finish() {
	journalctl -b --no-pager -o short-monotonic >/out/journal.txt 2>&1
	echo done >>"$results"
	systemctl poweroff --no-block
}
# fatal MESSAGE: what follows cannot run.
fatal() {
	bad "$*"
	note "stopped at the failure above"
	finish
	exit 0
}
trap finish EXIT

# wait_until SECONDS COMMAND...: polls every 0.1 s; the command's status.
wait_until() {
	local i n=$(($1 * 10))

	shift
	for ((i = 0; i < n; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	"$@" >/dev/null 2>&1
}
prop() { systemctl show -p "$2" --value "$1"; }
is_state() { [ "$(systemctl is-active "$1")" = "$2" ]; }
engine() { # USER ARGS...: the engine as USER, with a timeout
	timeout 30 runuser -u "$1" -- /usr/local/bin/boot-engine "${@:2}"
}
journal() { journalctl -u kvpaged --no-pager -o cat "$@"; }

# 1. apt installs the three packages into the running system: the maintainer scripts talk to
# systemd (the dependencies are in the root already; the container has no network).
apt-get install -y --no-install-recommends /kvtest/debs/*.deb >/out/apt.log 2>&1 ||
	fatal "apt-get install: $(tail -5 /out/apt.log)"
ok "apt-get installed kvpaged, libkvpaged1 and libkvpaged-dev"

# 2. sysusers.d made the user and the group; tmpfiles.d the directories, with its modes.
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd kvpaged) || fatal "no user kvpaged"
if [ "$uid" -lt 1000 ] && [ "$home" = /var/lib/kvpaged ] && [ "$shell" = /usr/sbin/nologin ]; then
	ok "system user kvpaged (uid $uid, home $home, shell $shell)"
else
	bad "user kvpaged: uid $uid, home $home, shell $shell"
fi
[ "$(getent group kvpaged | cut -d: -f3)" = "$gid" ] && ok "group kvpaged (gid $gid)" ||
	bad "group kvpaged is not the user's primary group"
while read -r type path mode user group _; do
	[ "$type" = d ] || continue
	got=$(stat -c '%a %U %G' "$path" 2>&1)
	if [ "$got" = "$((8#$mode)) $user $group" ] ||
		[ "$got" = "$(printf '%o' "$((8#$mode))") $user $group" ]; then
		ok "$path: mode $mode $user:$group, as tmpfiles.d says"
	else
		bad "$path: $got, tmpfiles.d says $mode $user $group"
	fi
done < <(grep -v '^#' /usr/lib/tmpfiles.d/kvpaged.conf)

# 3. The sockets listen; the service waits for its first client.
systemctl enable --now kvpaged.socket kvpaged-admin.socket >>/out/guest.log 2>&1 ||
	fatal "systemctl enable --now kvpaged.socket kvpaged-admin.socket"
for s in kvpaged.socket kvpaged-admin.socket; do
	[ "$(systemctl is-enabled $s)" = enabled ] && is_state $s active && ok "$s enabled and listening" ||
		bad "$s: $(systemctl is-enabled $s), $(systemctl is-active $s)"
done
is_state kvpaged.service inactive && ok "kvpaged.service is not running before a client connects" ||
	bad "kvpaged.service is $(systemctl is-active kvpaged.service) before any client"
[ "$(systemctl is-enabled kvpaged.service)" = disabled ] && ok "kvpaged.service is not started at boot" ||
	bad "kvpaged.service is $(systemctl is-enabled kvpaged.service): the package should enable only its sockets"
got=$(stat -c '%a %U %G' $sock)
[ "$got" = "660 root kvpaged" ] && ok "$sock: $got" || bad "$sock: $got, want 660 root kvpaged"
got=$(stat -c '%a %U %G' /run/kvpaged/admin.sock)
[ "$got" = "600 root root" ] && ok "/run/kvpaged/admin.sock: $got" || bad "admin.sock: $got, want 600 root root"

# 4. An engine built with pkg-config against libkvpaged-dev, run by a member of group kvpaged:
# its connection starts the daemon.
useradd -m -G kvpaged engine && useradd -m outsider || fatal "useradd"
flags=$(pkg-config --cflags --libs libkvpaged) || fatal "pkg-config libkvpaged"
# shellcheck disable=SC2086
cc -Wall -o /usr/local/bin/boot-engine /kvtest/boot-engine.c $flags >>/out/guest.log 2>&1 ||
	fatal "cc boot-engine.c $flags"
ok "an engine builds against libkvpaged-dev: cc ... $flags"
out=$(engine engine open $sock 64 1)
[ "$out" = cached=0 ] && ok "the first client's first call succeeds ($out)" || bad "first call: $out"
# What follows needs a daemon that systemd sees running.
wait_until 10 is_state kvpaged.service active && ok "systemd started kvpaged through socket activation" ||
	fatal "kvpaged.service is $(systemctl is-active kvpaged.service) after the first client: $(systemctl status kvpaged --no-pager 2>&1 | tail -4)"
journal | grep -q "listening on $sock (clients, from systemd)" && ok "the daemon took the client socket from systemd" ||
	bad "the journal does not say the socket came from systemd"
out=$(engine engine open $sock 64 1)
[ "$out" = cached=64 ] && ok "a second client finds the prefix cached ($out)" || bad "second call: $out"

# 5. What systemd shows: the daemon's STATUS= line, and the unit's notify settings.
# STATUS= follows within a few seconds (the daemon sends it at most every 2 s).
status_shows() { systemctl status kvpaged --no-pager 2>&1 | grep -qE "$1"; }
wait_until 10 status_shows 'Status: ".*pool main: .* hit rate [0-9.]+% \(4/8\)'
status=$(systemctl status kvpaged --no-pager 2>&1)
grep -qE 'Status: ".*pool main: .* hit rate [0-9.]+% \(4/8\)' <<<"$status" &&
	ok "systemctl status shows the daemon's STATUS=: $(grep -o 'Status: .*' <<<"$status")" ||
	bad "systemctl status shows no STATUS= with the hit rate: $status"
want_type=$(sed -n 's/^Type=//p' $unit)
want_access=$(sed -n 's/^NotifyAccess=//p' $unit)
want_dog=$(sed -n 's/^WatchdogSec=//p' $unit)
got=$(systemctl show -p Type,NotifyAccess,WatchdogUSec kvpaged | sort | tr '\n' ' ')
if [ "$got" = "NotifyAccess=$want_access Type=$want_type WatchdogUSec=$want_dog " ] &&
	[ "$want_type" = notify ] && [ "$want_access" = main ] && [ -n "$want_dog" ]; then
	ok "systemctl show: $got(as the unit says)"
else
	bad "systemctl show: $got; the unit says Type=$want_type NotifyAccess=$want_access WatchdogSec=$want_dog (want notify, main, a watchdog)"
fi

# 6. The watchdog: with a 1 s timeout (a drop-in), the daemon lives on, pinging.
mkdir -p /etc/systemd/system/kvpaged.service.d
printf '[Service]\nWatchdogSec=1s\n' >/etc/systemd/system/kvpaged.service.d/kvtest-watchdog.conf
systemctl daemon-reload && systemctl restart kvpaged || bad "restart with a 1 s watchdog"
pid=$(prop kvpaged MainPID)
restarts=$(prop kvpaged NRestarts)
sleep 5
if is_state kvpaged active && [ "$(prop kvpaged MainPID)" = "$pid" ] &&
	[ "$(prop kvpaged NRestarts)" = "$restarts" ] && [ "$(prop kvpaged WatchdogUSec)" = 1s ] &&
	! journal | grep -q "Watchdog timeout"; then
	ok "a 1 s watchdog does not kill it: the same pid $pid after 5 s"
else
	bad "the watchdog killed or restarted it: $(systemctl status kvpaged --no-pager 2>&1 | tail -5)"
fi
rm /etc/systemd/system/kvpaged.service.d/kvtest-watchdog.conf
systemctl daemon-reload

# 7. Reload: a live key (allow_groups, shown by kvpagedctl pools) changes in place; a key that
# needs a restart (capacity_blocks) keeps its value and the journal says why, as a warning.
pid=$(prop kvpaged MainPID)
cp $conf /out/kvpaged.conf.shipped
sed -i 's/^\[pool main\]$/[pool main]\nallow_groups = kvpaged/' $conf
cap=$(sed -n 's/^capacity_blocks = //p' $conf)
sed -i "s/^capacity_blocks = $cap/capacity_blocks = $((cap / 2))/" $conf
systemctl reload kvpaged && ok "systemctl reload kvpaged (ExecReload: $(prop kvpaged ExecReload | sed 's/.*argv\[\]=\([^;]*\);.*/\1/'))" ||
	bad "systemctl reload kvpaged: $(systemctl status kvpaged --no-pager 2>&1 | tail -5)"
pools=$(kvpagedctl pools 2>&1)
grep -q "access        groups kvpaged ($gid)" <<<"$pools" && ok "reload applied allow_groups: $(grep access <<<"$pools" | xargs)" ||
	bad "after the reload kvpagedctl pools shows: $pools"
grep -q "blocks        $cap of" <<<"$pools" && ok "capacity_blocks keeps its running value ($cap)" ||
	bad "capacity_blocks changed on reload: $pools"
[ "$(prop kvpaged MainPID)" = "$pid" ] && ok "the reload kept pid $pid" || bad "the reload replaced the daemon"
out=$(engine engine open $sock 64 1)
[ "$out" = cached=0 ] && ok "a member of group kvpaged still uses pool main ($out)" || bad "after reload: $out"
# A file that does not load: the reload fails, the daemon runs on with what it had.
cp $conf /out/kvpaged.conf.changed
echo "[pool" >>$conf
systemctl reload kvpaged 2>/dev/null && bad "systemctl reload succeeded with a broken file" ||
	ok "systemctl reload fails when the file does not load"
is_state kvpaged active && [ "$(prop kvpaged MainPID)" = "$pid" ] && ok "and kvpaged runs on (pid $pid)" ||
	bad "a failed reload stopped the daemon: $(systemctl status kvpaged --no-pager 2>&1 | tail -5)"
journal -p err | grep -q "reload failed, the running configuration stays: $conf:" &&
	ok "journalctl -p err says why: $(journal -p err | grep 'reload failed' | tail -1)" ||
	bad "journalctl -p err lacks the failed reload"

# 8. The journal has the daemon's lines at their syslog priorities.
warnings=$(journal -p warning)
grep -q "reload: \[pool main\] capacity_blocks: .*cannot change while kvpaged runs" <<<"$warnings" &&
	ok "journalctl -p warning has the refused key: $(grep capacity_blocks <<<"$warnings" | head -1)" ||
	bad "journalctl -p warning lacks the refused capacity_blocks: $warnings"
grep -q "listening on" <<<"$warnings" && bad "journalctl -p warning shows info lines" ||
	ok "journalctl -p warning leaves out the info lines"
journal -p info | grep -q "listening on $sock" && ok "journalctl -p info has them" ||
	bad "journalctl -p info lacks 'listening on'"
journal -p notice | grep -q "reload: \[pool main\] allow_groups" &&
	! journal -p warning | grep -q "reload: \[pool main\] allow_groups" &&
	ok "the applied key is a notice" || bad "the applied allow_groups is not logged as a notice"
cp /out/kvpaged.conf.shipped $conf

# 9. Who may connect: not a user outside group kvpaged; kvpagedctl as root, not as the engine.
out=$(engine outsider open $sock 64 1)
grep -q "Permission denied" <<<"$out" && ok "a user outside group kvpaged cannot connect ($out)" ||
	bad "outsider: $out"
kvpagedctl status >/dev/null 2>&1 && ok "kvpagedctl as root" || bad "kvpagedctl status as root"
timeout 10 runuser -u engine -- kvpagedctl status >/dev/null 2>&1 && bad "kvpagedctl works for the engine user" ||
	ok "kvpagedctl refuses a non-root user"

# 10. The sandbox: the exposure score, and where the daemon may write (as root in its mount
# namespace, so that only the sandbox, not file modes, stops it).
systemd-analyze security kvpaged --no-pager >/out/security.txt 2>&1
score=$(sed -n 's/.*Overall exposure level for kvpaged.service: \([0-9.]*\).*/\1/p' /out/security.txt)
[ -n "$score" ] && note "systemd-analyze security kvpaged: $(grep 'Overall exposure' /out/security.txt)" ||
	bad "systemd-analyze security printed no score"
awk -v s="${score:-10}" 'BEGIN { exit !(s <= 1.0) }' && ok "exposure score $score (at most 1.0)" ||
	bad "exposure score ${score:-none} above 1.0: the hardening directives do not hold"
pid=$(prop kvpaged MainPID)
in_ns() { timeout 10 nsenter -t "$pid" -m -- sh -c "$1" 2>&1; }
for path in /etc/kvtest /usr/kvtest /run/kvtest /var/lib/kvtest /var/log/kvtest; do
	out=$(in_ns ": >$path") && bad "the daemon's namespace may write $path" ||
		ok "cannot write $path ($(tail -1 <<<"$out" | sed 's/.*: //'))"
done
for path in /tmp /var/tmp; do
	out=$(in_ns ": >$path/kvtest-private") || bad "cannot write its private $path: $out"
	[ ! -e $path/kvtest-private ] && ok "its $path is private (PrivateTmp)" ||
		bad "what the daemon writes in $path is seen outside"
done
out=$(in_ns ": >/var/lib/kvpaged/kvtest && rm /var/lib/kvpaged/kvtest") &&
	ok "may write its state directory /var/lib/kvpaged" || bad "cannot write /var/lib/kvpaged: $out"
out=$(in_ns "ls /home/engine") && bad "the daemon sees /home: $out" || ok "/home is hidden"
grep -q "^CapEff:	0*$" /proc/"$pid"/status && ok "no effective capability" ||
	bad "capabilities: $(grep ^Cap /proc/"$pid"/status | xargs)"

# 10b. The metrics endpoint under systemd: refused by the sandbox as packaged; with the
# drop-in docs/operations.md gives, scraped over loopback (the container's own).
scrape() { # prints the HTTP answer to GET /metrics on 127.0.0.1:9464
	timeout 10 bash -c 'exec 3<>/dev/tcp/127.0.0.1/9464 &&
		printf "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n" >&3 && cat <&3' 2>&1
}
cp $conf /out/kvpaged.conf.before-metrics
sed -i 's/^\[daemon\]$/[daemon]\nmetrics_listen = 127.0.0.1:9464/' $conf
grep -q "^metrics_listen = 127.0.0.1:9464" $conf || fatal "the shipped configuration has no [daemon] section"
systemctl restart kvpaged 2>/dev/null && bad "kvpaged started with metrics_listen inside the packaged sandbox" ||
	ok "as packaged, the sandbox keeps the metrics endpoint from binding: $(journal -p err | grep metrics_listen | tail -1)"
mkdir -p /etc/systemd/system/kvpaged.service.d
printf '[Service]\nPrivateNetwork=no\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\n' \
	>/etc/systemd/system/kvpaged.service.d/metrics.conf
systemctl daemon-reload
systemctl reset-failed kvpaged
systemctl restart kvpaged || bad "kvpaged with the metrics drop-in: $(journal -p err | tail -3)"
out=$(scrape)
grep -q "^HTTP/1.1 200" <<<"$out" && grep -q "^kvpaged_pool_blocks{" <<<"$out" &&
	ok "with the drop-in, GET /metrics answers: $(grep -c '^kvpaged_' <<<"$out") samples" ||
	bad "GET /metrics with the drop-in: $(head -5 <<<"$out")"
rm /etc/systemd/system/kvpaged.service.d/metrics.conf
cp /out/kvpaged.conf.before-metrics $conf
systemctl daemon-reload
systemctl restart kvpaged || bad "restart without the metrics endpoint"

# 11. Stop: a graceful drain, exit status 0, a connected client sees a clean close.
engine engine loop $sock >/out/loop.out 2>&1 &
loop=$!
wait_until 10 grep -q connected /out/loop.out || bad "the loop client did not connect: $(cat /out/loop.out)"
systemctl stop kvpaged || bad "systemctl stop kvpaged"
wait $loop && ok "the connected client saw a clean close: $(tail -1 /out/loop.out)" ||
	bad "the client saw: $(cat /out/loop.out)"
got="$(prop kvpaged ExecMainStatus) $(prop kvpaged Result)"
[ "$got" = "0 success" ] && ok "kvpaged exited with status 0" || bad "stop: ExecMainStatus, Result: $got"
journal | grep -q "stopping: draining" && ok "it drained ($(journal | grep 'stopping: draining' | tail -1))" ||
	bad "the journal shows no drain"

# 12. Persistence: with the file tier persisting, a restart finds the cached prefixes.
cat >$conf <<-'EOF'
	[pool main]
	layers = 2
	kv_heads = 2
	head_dim = 64
	element_bytes = 2
	block_tokens = 16
	capacity_blocks = 64
	file_tier_blocks = 256
	swap_files = /var/lib/kvpaged/swap0
	file_tier_persist = yes
EOF
out=$(engine engine open $sock 256 5000)
[ "$out" = cached=0 ] && ok "with a persistent file tier: a fresh prompt ($out)" || bad "persistent pool: $out"
systemctl stop kvpaged || bad "systemctl stop kvpaged (persistent)"
[ "$(prop kvpaged ExecMainStatus)" = 0 ] || bad "the persisting stop exited with $(prop kvpaged ExecMainStatus)"
out=$(engine engine open $sock 256 5000)
[ "$out" = cached=256 ] && ok "after a restart the prefix is still cached ($out)" ||
	bad "after a restart: $out, want cached=256"

# 13. A crash: systemd restarts the daemon (Restart=), clients reconnect.
pid=$(prop kvpaged MainPID)
restarts=$(prop kvpaged NRestarts)
engine engine loop $sock >/out/loop.out 2>&1 &
loop=$!
wait_until 10 grep -q connected /out/loop.out
kill -SEGV "$pid"
wait $loop
note "the client at the crash: $(tail -1 /out/loop.out)"
if wait_until 20 sh -c "[ \"\$(systemctl show -p NRestarts --value kvpaged)\" = $((restarts + 1)) ]" &&
	wait_until 10 is_state kvpaged active && [ "$(prop kvpaged MainPID)" != "$pid" ]; then
	ok "after kill -SEGV systemd restarted it (NRestarts $((restarts + 1)), pid $(prop kvpaged MainPID))"
else
	bad "no restart after SEGV: $(systemctl status kvpaged --no-pager 2>&1 | tail -8)"
fi
out=$(engine engine open $sock 64 1)
[ "${out%%=*}" = cached ] && ok "a client reconnects after the crash ($out)" || bad "after the crash: $out"

# 14. Purge: no unit, no configuration, no state; the system user stays (Debian keeps them).
apt-get purge -y kvpaged libkvpaged-dev libkvpaged1 >/out/purge.log 2>&1 || bad "apt-get purge: $(tail -5 /out/purge.log)"
left=$(find /lib/systemd/system /etc/systemd/system /usr/lib/systemd/system -name 'kvpaged*' 2>/dev/null)
[ -z "$left" ] && ok "purge left no unit" || bad "purge left: $left"
[ -z "$(systemctl list-units --all --no-legend 'kvpaged*' | grep -v 'not-found')" ] &&
	ok "no kvpaged unit is loaded" || bad "loaded after purge: $(systemctl list-units --all --no-legend 'kvpaged*')"
pgrep -x kvpaged >/dev/null && bad "kvpaged still runs after purge" || ok "kvpaged does not run"
for path in /etc/kvpaged /var/lib/kvpaged /usr/sbin/kvpaged /usr/bin/kvpagedctl; do
	[ ! -e $path ] && ok "purge removed $path" || bad "purge left $path"
done
getent passwd kvpaged >/dev/null && ok "the system user kvpaged stays" || bad "purge removed user kvpaged"
