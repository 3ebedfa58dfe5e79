#!/usr/bin/env bash
# Runs the units of contrib/systemd under a real systemd, on a machine whose PID 1 need not be systemd:
# boots /lib/systemd/systemd as PID 1 of private PID, mount, UTS, IPC, network and cgroup namespaces,
# over a copy-on-write view of the root file system (an overlay whose writes go to a tmpfs), installs
# with scripts/install.sh into that view, and starts, reloads and stops rein-serve (also socket
# activated), rein-gateway over it and rein-pshift-controller, with the admin token passed as a
# credential as docs/operations.md says; then rein-serve with an image of root's in /srv, a block device
# (a loop device, also through a link), an LVM logical volume and an image it creates in /srv (opened
# again under another uid), under the unit as shipped and with the runbook's drop-ins ("Exports outside
# /var/lib/rein"). Needs root, systemd, util-linux, iproute2, curl, libnbd-bin (nbdinfo, nbdcopy), and a
# kernel with overlayfs and cgroup2 (on its own or beside cgroup v1); without a free loop device the
# block-device checks are skipped, and without lvm2 or device-mapper the LVM volume's, saying so.
# Prints each check, then PASS or FAIL (exit status 1). Everything it creates (the namespaces and every
# process in them, the mounts, a cgroup, loop devices, a volume group, a temporary directory) is gone
# when it exits, however it exits (killed with SIGKILL, it leaves the empty cgroup, the directory, named
# rein-systemd-check.*, the loop devices over its blk.img and pv.img and the volume group reincheckPID).
# Nothing reaches the host: /proc/sys and sysfs are read-only inside, the kernel-wide units are masked,
# and the network namespace has only its own loopback (the daemons listen on 127.0.0.201-203).
# Usage: [REIN=path] bash scripts/systemd-check.sh    (default REIN: target/release/rein)
set -euo pipefail

# --- inside the namespaces: PID 1 until it becomes systemd ------------------------------------------
if [ "${1:-}" = __init ]; then
  W=$2 SRC=$3 BIN=$4 LOOP=${5:-}
  mount -t tmpfs -o mode=755 rein-check "$W/t"
  mkdir "$W/t/up" "$W/t/wk" "$W/t/root"
  R=$W/t/root
  mount -t overlay overlay -o "lowerdir=/,upperdir=$W/t/up,workdir=$W/t/wk" "$R"
  mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
  # Kernel-wide settings stay out of reach (systemd and systemd-sysctl would write /proc/sys).
  for p in sys sysrq-trigger irq bus fs acpi; do
    [ -e "$R/proc/$p" ] || continue
    mount --bind "$R/proc/$p" "$R/proc/$p"
    mount -o remount,bind,ro "$R/proc/$p"
  done
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
  # A cgroup2 hierarchy whose root is the cgroup made for this run (the cgroup namespace's root).
  mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
  mount -t tmpfs -o mode=755,nosuid dev "$R/dev"
  for n in null zero full random urandom tty; do
    touch "$R/dev/$n"
    mount --bind "/dev/$n" "$R/dev/$n"
  done
  # The loop device of the block-device export, made as udev makes a disk's node on a host (group disk,
  # mode 0660: KERNEL=="loop[0-9]*", GROUP="disk"), whatever the mode of this machine's node: what the
  # service may open is then its unit's to say (PrivateDevices=, DeviceAllow=, SupplementaryGroups=).
  if [ -n "$LOOP" ]; then
    mknod -m 660 "$R$LOOP" b "0x$(stat -c %t "$LOOP")" "0x$(stat -c %T "$LOOP")"
    chgrp disk "$R$LOOP"
  fi
  mkdir "$R/dev/pts" "$R/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
  ln -s pts/ptmx "$R/dev/ptmx"
  mount -t tmpfs -o mode=1777,nosuid,nodev shm "$R/dev/shm"
  touch "$R/dev/console"
  mount --bind "$W/console.log" "$R/dev/console"
  ln -s /proc/self/fd "$R/dev/fd"
  for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${i%%:*}" "$R/dev/${i#*:}"; done
  mount -t tmpfs -o mode=755,nosuid,nodev run "$R/run"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmp "$R/tmp"
  # The units install.sh writes, and nothing of the host's.
  mount -t tmpfs -o mode=755 units "$R/etc/systemd/system"
  : > "$R/etc/fstab"
  # The source tree (install.sh and the units) and the binary, read-only.
  mkdir -p "$R/rein-check/src"
  touch "$R/rein-check/rein"
  mount --bind "$SRC" "$R/rein-check/src"
  mount -o remount,bind,ro "$R/rein-check/src"
  mount --bind "$BIN" "$R/rein-check/rein"
  mount -o remount,bind,ro "$R/rein-check/rein"
  cat > "$R/etc/systemd/system/rein-check.target" <<'EOF'
[Unit]
Description=Rein's systemd check (scripts/systemd-check.sh)
Requires=sysinit.target
After=sysinit.target
EOF
  # Units that would reach the kernel or the host (most are skipped in a container anyway).
  for u in systemd-sysctl.service systemd-modules-load.service systemd-binfmt.service \
    proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount systemd-pstore.service \
    systemd-timesyncd.service systemd-udevd.service systemd-udev-trigger.service \
    systemd-hwdb-update.service kmod-static-nodes.service sys-kernel-config.mount sys-kernel-debug.mount \
    sys-kernel-tracing.mount sys-fs-fuse-connections.mount dev-hugepages.mount systemd-firstboot.service \
    systemd-machine-id-commit.service systemd-repart.service systemd-pcrphase.service \
    systemd-pcrphase-sysinit.service systemd-random-seed.service systemd-journald-audit.socket \
    apparmor.service; do
    ln -s /dev/null "$R/etc/systemd/system/$u"
  done
  ip link set lo up
  cd "$R"
  mkdir -p .oldroot
  pivot_root . .oldroot
  umount -l /.oldroot
  rmdir /.oldroot
  # Shared inside (a container manager's job: systemd leaves it to one): LoadCredential= moves the
  # credentials' file system into /run from a namespace of its own, which needs /run's propagation.
  mount --make-rshared /
  exec env -i container=rein-check PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    setpriv --bounding-set -sys_module,-sys_time,-sys_boot,-sys_rawio,-syslog,-wake_alarm,-block_suspend,-mac_admin,-mac_override,-audit_control,-audit_read,-sys_pacct,-linux_immutable \
    /lib/systemd/systemd --system --unit=rein-check.target
fi

# --- outside: set up, check, clean up -----------------------------------------------------------------
cd "$(dirname "$0")/.."
SRC=$(pwd)
say() { echo "systemd-check: $*" >&2; }
REIN=${REIN:-target/release/rein}
[ -x "$REIN" ] || { say "no rein binary at $REIN (cargo build --release --locked -p rein, or REIN=path)"; exit 2; }
REIN=$(realpath "$REIN")
[ "$(id -u)" = 0 ] || { say "needs root (namespaces, mounts, a cgroup)"; exit 2; }
for tool in unshare nsenter setpriv pivot_root ip curl nbdinfo nbdcopy timeout; do
  command -v "$tool" >/dev/null || { say "needs $tool (util-linux, iproute2, curl, libnbd-bin, coreutils)"; exit 2; }
done
[ -x /lib/systemd/systemd ] || { say "needs systemd (/lib/systemd/systemd)"; exit 2; }
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  cgroot=/sys/fs/cgroup
elif [ "$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ]; then
  cgroot=/sys/fs/cgroup/unified
else
  say "needs a cgroup2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified)"
  exit 2
fi

W=$(mktemp -d "${TMPDIR:-/tmp}/rein-systemd-check.XXXXXX")
CG="$cgroot$(sed -n 's/^0:://p' /proc/self/cgroup)"
CG="${CG%/}/rein-systemd-check.$$"
up="" pid1="" loop="" pvloop="" vg="" lvdev="" pvdev="" lvm_skip=""
# LVM's commands, kept to the loop device of this run (the host's own volumes are not scanned), writing
# nothing to /etc/lvm (no metadata backups, no devices file); without udev (a container) they make the
# device nodes themselves.
lvmconf() {
  local udev=""
  [ -S /run/udev/control ] || udev=" udev_sync = 0 udev_rules = 0"
  printf '%s' "devices { filter = [ \"a|^$pvloop\$|\", \"r|.*|\" ] use_devicesfile = 0 } backup { backup = 0 archive = 0 } activation { monitoring = 0$udev }"
}
lvmc() { LVM_SUPPRESS_FD_WARNINGS=1 lvm "$1" --config "$(lvmconf)" "${@:2}" >>"$W/lvm.log" 2>&1; }
cleanup() {
  local rc=$? i
  trap - EXIT INT TERM HUP
  if [ -n "$pid1" ] && [ -e "/proc/$pid1" ]; then
    kill -s RTMIN+4 "$pid1" 2>/dev/null || true # systemd's poweroff: it stops the units, then exits
    for i in $(seq 100); do [ -e "/proc/$pid1" ] || break; sleep 0.2; done
    kill -KILL "$pid1" 2>/dev/null || true # takes every process of the PID namespace with it
  fi
  if [ -n "$up" ]; then
    kill -KILL "$up" 2>/dev/null || true
    wait "$up" 2>/dev/null || true
  fi
  if [ -n "$loop" ]; then losetup -d "$loop" 2>/dev/null || say "could not detach the loop device $loop"; fi
  if [ -n "$vg" ]; then
    lvmc vgremove -f -q "$vg" || dmsetup remove "$vg-lv" 2>/dev/null || true
    lvmc vgs "$vg" && say "could not remove the volume group $vg (lvm vgremove $vg)"
  fi
  if [ -n "$pvloop" ]; then
    lvmc pvremove -q "$pvloop" || true
    losetup -d "$pvloop" 2>/dev/null || say "could not detach the loop device $pvloop"
  fi
  if [ -d "$CG" ]; then
    for i in $(seq 50); do
      find "$CG" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$CG" ] || break
      sleep 0.2
    done
    [ ! -d "$CG" ] || say "could not remove the cgroup $CG"
  fi
  rm -rf "$W"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted: stopping systemd and cleaning up"; exit 130' INT TERM HUP

mkdir "$W/t"
touch "$W/console.log"
mkdir "$CG"
# The block device of the block-device export: a loop device over a file here, detached at the end.
truncate -s 16M "$W/blk.img"
if command -v losetup >/dev/null; then loop=$(losetup --find --show "$W/blk.img" 2>/dev/null) || loop=""; fi
[ -n "$loop" ] || say "no loop device (losetup --find): the block-device export's checks are skipped"
# An LVM logical volume (docs/operations.md, "Exports outside /var/lib/rein"): a volume group of this
# run over a second loop device, removed at the end.
if [ -z "$loop" ]; then
  lvm_skip="no loop device"
elif ! command -v lvm >/dev/null; then
  lvm_skip="no lvm (apt-get install lvm2)"
elif ! dmsetup version >/dev/null 2>&1; then
  lvm_skip="no device-mapper in this kernel (dmsetup version fails)"
else
  truncate -s 24M "$W/pv.img"
  pvloop=$(losetup --find --show "$W/pv.img" 2>/dev/null) || pvloop=""
  if [ -z "$pvloop" ]; then
    lvm_skip="no second loop device"
  elif ! lvmc pvcreate -q "$pvloop"; then
    lvm_skip="pvcreate $pvloop failed ($(tail -1 "$W/lvm.log"))"
  else
    vg=reincheck$$
    if lvmc vgcreate -q -s 1m "$vg" "$pvloop" && lvmc lvcreate -q -y -L 16m -n lv "$vg"; then
      lvdev=$(dmsetup info -c --noheadings -o major,minor "$vg-lv" 2>/dev/null | tr -d ' ') || lvdev=""
      pvdev=$((0x$(stat -c %t "$pvloop"))):$((0x$(stat -c %T "$pvloop")))
      [ -n "$lvdev" ] || lvm_skip="no device-mapper device for $vg/lv"
    else
      lvm_skip="vgcreate or lvcreate failed ($(grep -v -e "^ *Run " "$W/lvm.log" | tail -1 | sed "s/^ *//"))"
    fi
  fi
fi
[ -z "$lvm_skip" ] || say "$lvm_skip: the LVM logical volume's checks are skipped"
say "booting systemd ($(/lib/systemd/systemd --version | head -1)) as PID 1 of its own namespaces ..."
# unshare dies with this script, even by SIGKILL (--pdeathsig), and takes the namespaces' PID 1 with it.
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$CG" setpriv --pdeathsig SIGKILL \
  unshare --pid --fork --mount --uts --ipc --net --cgroup --propagation private --kill-child=SIGKILL \
  bash "$SRC/scripts/systemd-check.sh" __init "$W" "$SRC" "$REIN" "$loop" </dev/null >"$W/init.log" 2>&1 &
up=$!
for _ in $(seq 100); do
  pid1=$(cat "/proc/$up/task/$up/children" 2>/dev/null || true)
  pid1=${pid1%% *}
  [ -n "$pid1" ] && [ "$(cat "/proc/$pid1/comm" 2>/dev/null)" = systemd ] && break
  [ -e "/proc/$up" ] || break
  sleep 0.1
done
if [ -z "$pid1" ] || [ "$(cat "/proc/$pid1/comm" 2>/dev/null)" != systemd ]; then
  say "systemd did not start; the namespace's setup said:"
  cat "$W/init.log" >&2
  exit 1
fi

# A command inside (as root, in the namespaces, at their root).
ns() { nsenter -t "$pid1" -a -r -w -- env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 SYSTEMD_PAGER= SYSTEMD_COLORS=0 timeout 90 "$@"; }
nsh() { ns bash -c "$1"; } # a shell line inside

checks=0 failed=()
pass() { checks=$((checks + 1)); say "[ ok ] $1"; }
fail() {
  checks=$((checks + 1))
  failed+=("$1")
  say "[FAIL] $1"
  [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/         /' >&2
}
# check DESCRIPTION SHELL-LINE: passes when the line (run inside) exits 0; its output is shown on failure.
check() {
  local out
  if out=$(nsh "$2" 2>&1); then
    pass "$1"
  else
    fail "$1" "$out
-- the journal's last lines:
$(ns journalctl --no-pager -q -n 12 -o cat 2>&1 || true)"
  fi
}
# expect DESCRIPTION WANT GOT: passes when GOT matches the extended regular expression WANT.
expect() {
  if grep -Eq -- "$2" <<<"$3"; then pass "$1 ($3)"; else fail "$1: wanted /$2/, got '$3'"; fi
}
prop() { ns systemctl show -P "$2" "$1" 2>/dev/null || true; }
# reloaded UNIT PATTERN [WHAT]: `systemctl reload UNIT` succeeds and its StatusText then matches PATTERN.
reloaded() {
  check "systemctl reload $1${3:+ ($3)}" "systemctl reload $1"
  sleep 1
  expect "the reload ended: StatusText" "$2" "$(prop "$1" StatusText)"
}
# stopped_in_time UNIT: `systemctl stop UNIT` succeeds, and it ended cleanly within 10 s.
stopped_in_time() {
  local start
  start=$(date +%s)
  check "systemctl stop $1" "systemctl stop $1"
  expect "it stopped cleanly, in time (Result, exit status, seconds)" '^success 0 [0-9]$' \
    "$(prop "$1" Result) $(prop "$1" ExecMainStatus) $(($(date +%s) - start))"
}
# The unit's log since the last mark (journalctl --cursor-file).
log_since() { ns journalctl --no-pager -q -o cat --cursor-file="/run/rein-check.$1.cursor" -u "$1" 2>/dev/null || true; }
mark() { log_since "$1" >/dev/null; }
# No warning of systemd's about a unit: its file was read as written.
unit_warnings() { ns journalctl --no-pager -q -o cat _PID=1 2>/dev/null | grep -E "rein-[a-z-]+\.(service|socket)(\.d/[^:]+)?:[0-9]+: " || true; }
log_errors() { # log_errors UNIT: nothing in its log since the last mark is an error
  local w
  w=$(log_since "$1")
  if grep -qiE 'panic|error|fail' <<<"$w"; then fail "$1: its log has no error" "$w"; else pass "$1: its log has no error"; fi
}
dynamic_user() { # dynamic_user UNIT: the main process's user is the unit's dynamic one
  local pid uid name
  pid=$(prop "$1" MainPID)
  uid=$(nsh "awk '/^Uid:/ {print \$2}' /proc/$pid/status" 2>/dev/null || true)
  name=$(ns getent passwd "$uid" 2>/dev/null | cut -d: -f1 || true)
  if [ -n "$uid" ] && [ "$uid" -ge 61184 ] && [ "$uid" -le 65519 ] && [ "$name" = "${1%.service}" ]; then
    pass "$1 runs as the dynamic user $name (uid $uid)"
  else
    fail "$1 runs as a dynamic user: main pid ${pid:-none}, uid '${uid}', user '${name}'"
  fi
}
http() { # http URL [TOKEN-FILE]: the status code
  if [ -n "${2:-}" ]; then
    nsh "curl -s -o /dev/null -w '%{http_code}' -H \"Authorization: Bearer \$(cat $2)\" $1" || true
  else
    ns curl -s -o /dev/null -w '%{http_code}' "$1" || true
  fi
}

for _ in $(seq 100); do ns test -S /run/systemd/private 2>/dev/null && break; sleep 0.1; done
state=$(ns systemctl is-system-running --wait 2>&1 || true)
if [ "$state" = running ]; then
  pass "systemd is up in the namespace (is-system-running: $state)"
else
  fail "systemd is up in the namespace (is-system-running: $state)" "$(ns systemctl --failed --no-pager 2>&1 || true)"
fi

# --- install ------------------------------------------------------------------------------------------
check "scripts/install.sh installs into /usr/local and /etc/systemd/system" \
  "cd /rein-check/src && REIN=/rein-check/rein bash scripts/install.sh"
check "the units are installed, naming /usr/local/bin/rein" \
  "for u in rein-serve.service rein-serve-nbd.socket rein-serve-admin.socket rein-gateway.service rein-gateway-nbd.socket rein-pshift-controller.service rein-pshift-controller.socket; do test -f /etc/systemd/system/\$u || { echo missing \$u; exit 1; }; done; grep -q '^ExecStart=/usr/local/bin/rein serve' /etc/systemd/system/rein-serve.service && /usr/local/bin/rein --version"
ns systemctl daemon-reload
w=$(unit_warnings)
if [ -z "$w" ]; then pass "systemd reads the units without a warning"; else fail "systemd reads the units without a warning" "$w"; fi

# --- rein serve: the runbook's configuration, on 127.0.0.201 ----------------------------------------
toml=$(awk '/^```toml/ {f = 1; next} /^```/ {if (f) exit} f' docs/operations.md)
conf=$(printf '%s\n' "$toml" | sed -E \
  -e 's|^listen = "[^"]*"|listen = "127.0.0.201:10809"|' \
  -e 's|^admin = "[^"]*"|admin = "127.0.0.201:9180"|' \
  -e 's|^size_mb = [0-9]+|size_mb = 16|')
if grep -q '^listen = "127.0.0.201:10809"' <<<"$conf" && grep -q '^admin = "127.0.0.201:9180"' <<<"$conf" &&
  grep -q '^admin_token_file = "/run/credentials/rein-serve.service/admin.token"' <<<"$conf" &&
  grep -q '^data_dir = "/var/lib/rein"' <<<"$conf"; then
  pass "docs/operations.md's rein.toml (listen, admin, admin_token_file, data_dir; on 127.0.0.201, 16 MB exports)"
else
  fail "docs/operations.md's rein.toml has listen, admin, the credential's admin_token_file and data_dir" "$conf"
fi
# A storage node for the gateway below.
conf=$(printf '%s\n\n[node]\nenabled = true\n' "$conf")
printf '%s\n' "$conf" | ns bash -c 'mkdir -p /etc/rein && cat > /etc/rein/rein.toml'
# The runbook's step 3: the token, private to root, and the drop-in that passes it as a credential.
check "the admin token, private to root (docs/operations.md, step 3)" \
  "head -c 32 /dev/urandom | base64 > /etc/rein/admin.token && chmod 600 /etc/rein/admin.token"
for svc in rein-serve rein-gateway rein-pshift-controller; do
  nsh "mkdir -p /etc/systemd/system/$svc.service.d && printf '[Service]\nLoadCredential=admin.token:/etc/rein/admin.token\n' > /etc/systemd/system/$svc.service.d/override.conf"
done
check "rein serve --check-config on a copy naming /etc/rein/admin.token (the runbook's check before a first start)" \
  "sed 's|^admin_token_file = .*|admin_token_file = \"/etc/rein/admin.token\"|' /etc/rein/rein.toml > /tmp/check.toml && rein serve --config /tmp/check.toml --check-config"
ns systemctl daemon-reload
w=$(unit_warnings)
if [ -z "$w" ]; then pass "the drop-ins are read without a warning"; else fail "the drop-ins are read without a warning" "$w"; fi

token=/etc/rein/admin.token
serve_checks() { # serve_checks NBD-ADDR ADMIN-ADDR WHAT
  local nbd=$1 admin=$2 what=$3
  expect "rein-serve.service is active ($what)" '^active$' "$(ns systemctl is-active rein-serve.service || true)"
  expect "its readiness and status came over sd_notify (Type=notify, StatusText)" '^notify listening' \
    "$(prop rein-serve.service Type) $(prop rein-serve.service StatusText)"
  dynamic_user rein-serve.service
  check "the token reached it as a credential: /run/credentials/rein-serve.service/admin.token" \
    "cmp /etc/rein/admin.token /run/credentials/rein-serve.service/admin.token"
  expect "GET /metrics without the token is refused" '^401$' "$(http "http://$admin/metrics")"
  expect "GET /metrics with the token" '^200$' "$(http "http://$admin/metrics" "$token")"
  check "rein admin --admin $admin --admin-token-file $token tenants" \
    "out=\$(rein admin --admin $admin --admin-token-file $token tenants) && echo \"\$out\" && echo \"\$out\" | grep -q gold && echo \"\$out\" | grep -q bronze"
  check "rein admin --config /etc/rein/rein.toml status (the runbook's step 4: address and token from the file)" \
    "rein admin --config /etc/rein/rein.toml status"
  check "nbdinfo reads export vm1 (16 MiB) at nbd://$nbd/vm1" \
    "nbdinfo --size nbd://$nbd/vm1 | grep -qx 16777216"
  check "the exports' images are in the StateDirectory /var/lib/rein" \
    "ls /var/lib/private/rein | grep -q vm1"
}

say "rein-serve.service ..."
mark rein-serve.service
check "systemctl start rein-serve.service" "systemctl start rein-serve.service"
serve_checks 127.0.0.201:10809 127.0.0.201:9180 "its own listeners"
check "a client writes 1 MiB to vm1 and reads it back (nbdcopy; the image under ProtectSystem=strict)" \
  "head -c 1048576 /dev/urandom > /tmp/data && nbdcopy /tmp/data nbd://127.0.0.201:10809/vm1 && nbdcopy nbd://127.0.0.201:10809/vm1 - | head -c 1048576 | cmp - /tmp/data"
if [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" = 0 ]; then
  check "its file IO runs on io_uring under the unit's sandboxing (no thread-pool fallback in its log)" \
    "! journalctl -q -o cat -u rein-serve.service | grep 'io_uring unavailable'"
fi
check "its log says where it listens and its data_dir (journalctl -u rein-serve)" \
  "journalctl -q -o cat -u rein-serve.service | grep 'listening' | grep -q 'data_dir=/var/lib/rein'"
pid=$(prop rein-serve.service MainPID)
nsh "sed -i -E 's/^reservation = 500\$/reservation = 600/' /etc/rein/rein.toml"
reloaded rein-serve.service '^configuration reloaded: 1 change' "bronze's reservation 500 -> 600"
check "the running server has the new reservation (rein admin tenants)" \
  "rein admin --admin 127.0.0.201:9180 --admin-token-file $token tenants | grep bronze | grep -q 600"
check "rein_config_last_reload_successful 1 in /metrics" \
  "curl -s -H \"Authorization: Bearer \$(cat $token)\" http://127.0.0.201:9180/metrics | grep -qx 'rein_config_last_reload_successful 1'"
log_errors rein-serve.service
nsh "cp /etc/rein/rein.toml /tmp/good.toml && echo 'no_such_key = 1' >> /etc/rein/rein.toml"
if nsh "systemctl reload rein-serve.service" >/dev/null 2>&1; then
  fail "systemctl reload fails on a file a reload would refuse"
else
  pass "systemctl reload fails on a file a reload would refuse"
fi
expect "... and the server runs on, the same process" "^active $pid\$" \
  "$(ns systemctl is-active rein-serve.service || true) $(prop rein-serve.service MainPID)"
nsh "cp /tmp/good.toml /etc/rein/rein.toml"
mark rein-serve.service
stopped_in_time rein-serve.service

# --- rein serve, socket activated ---------------------------------------------------------------------
say "rein-serve-nbd.socket and rein-serve-admin.socket ..."
nsh "mkdir -p /etc/systemd/system/rein-serve-nbd.socket.d /etc/systemd/system/rein-serve-admin.socket.d
printf '[Socket]\nListenStream=\nListenStream=127.0.0.201:10809\n' > /etc/systemd/system/rein-serve-nbd.socket.d/address.conf
printf '[Socket]\nListenStream=\nListenStream=127.0.0.201:9180\n' > /etc/systemd/system/rein-serve-admin.socket.d/address.conf"
ns systemctl daemon-reload
mark rein-serve.service
check "systemctl start rein-serve-nbd.socket rein-serve-admin.socket" \
  "systemctl start rein-serve-nbd.socket rein-serve-admin.socket"
expect "the service waits for a client" '^inactive$' "$(ns systemctl is-active rein-serve.service || true)"
check "a client's connection starts it: nbdinfo nbd://127.0.0.201:10809/vm1" \
  "nbdinfo --size nbd://127.0.0.201:10809/vm1 | grep -qx 16777216"
serve_checks 127.0.0.201:10809 127.0.0.201:9180 "socket activated"
check "it serves the sockets systemd passed, NBD and admin (its log)" \
  "journalctl -q -o cat -u rein-serve.service | grep -q 'NBD on the socket passed by the service manager' && journalctl -q -o cat -u rein-serve.service | grep -q 'the admin endpoint on the socket passed by the service manager'"
check "systemctl stop rein-serve.service: the sockets stay" \
  "systemctl stop rein-serve.service && systemctl is-active rein-serve-nbd.socket rein-serve-admin.socket"
check "the next client starts it again" "nbdinfo --size nbd://127.0.0.201:10809/vm1 | grep -qx 16777216"
check "systemctl stop rein-serve-nbd.socket rein-serve-admin.socket rein-serve.service" \
  "systemctl stop rein-serve-nbd.socket rein-serve-admin.socket rein-serve.service"
expect "it stopped cleanly" '^success 0$' "$(prop rein-serve.service Result) $(prop rein-serve.service ExecMainStatus)"
log_errors rein-serve.service
check "systemctl start rein-serve.service (its own listeners again, the node of the gateway)" \
  "systemctl start rein-serve.service"

# --- rein gateway over the node ------------------------------------------------------------------------
say "rein-gateway.service ..."
nsh "cat > /etc/rein/gw.toml" <<'EOF'
listen = "127.0.0.202:10809"
admin = "127.0.0.202:9190"
admin_token_file = "/run/credentials/rein-gateway.service/admin.token"
layout_file = "/var/lib/rein-gateway/gw-layouts.json"

[[nodes]]
name = "s1"
address = "127.0.0.201:10809"
protocol = "rein"

[[tenants]]
name = "gold"
reservation = 5000
limit = 15000
weight = 4

[[exports]]
name = "vol1"
tenant = "gold"
size_mb = 16
node_export = "vm1"
EOF
mark rein-gateway.service
check "systemctl start rein-gateway.service" "systemctl start rein-gateway.service"
expect "rein-gateway.service is active" '^active$' "$(ns systemctl is-active rein-gateway.service || true)"
expect "its readiness and status came over sd_notify" '^notify listening' \
  "$(prop rein-gateway.service Type) $(prop rein-gateway.service StatusText)"
dynamic_user rein-gateway.service
expect "GET /metrics without the token is refused" '^401$' "$(http http://127.0.0.202:9190/metrics)"
expect "GET /metrics with the token" '^200$' "$(http http://127.0.0.202:9190/metrics "$token")"
check "rein admin nodes: s1 is up" \
  "rein admin --admin 127.0.0.202:9190 --admin-token-file $token nodes | tee /dev/stderr | grep s1 | grep -q '1/1'"
check "nbdinfo reads volume vol1 through the gateway" "nbdinfo --size nbd://127.0.0.202:10809/vol1 | grep -qx 16777216"
check "what the client wrote to vm1 reads back through the gateway's volume vol1 (nbdcopy)" \
  "nbdcopy nbd://127.0.0.202:10809/vol1 - | head -c 1048576 | cmp - /tmp/data"
check "its layout file is in its StateDirectory" "test -s /var/lib/private/rein-gateway/gw-layouts.json"
reloaded rein-gateway.service '^configuration reloaded'
stopped_in_time rein-gateway.service
nsh "mkdir -p /etc/systemd/system/rein-gateway-nbd.socket.d
printf '[Socket]\nListenStream=\nListenStream=127.0.0.202:10819\n' > /etc/systemd/system/rein-gateway-nbd.socket.d/address.conf"
ns systemctl daemon-reload
check "systemctl start rein-gateway-nbd.socket; a client starts the gateway" \
  "systemctl start rein-gateway-nbd.socket && nbdinfo --size nbd://127.0.0.202:10819/vol1 | grep -qx 16777216 && systemctl is-active rein-gateway.service"
check "systemctl stop rein-gateway-nbd.socket rein-gateway.service" "systemctl stop rein-gateway-nbd.socket rein-gateway.service"
expect "it stopped cleanly" '^success 0$' "$(prop rein-gateway.service Result) $(prop rein-gateway.service ExecMainStatus)"
log_errors rein-gateway.service
ns systemctl stop rein-serve.service || true

# --- rein pshift controller ------------------------------------------------------------------------------
say "rein-pshift-controller.service ..."
nsh "cat > /etc/rein/ctl.toml" <<'EOF'
listen = "127.0.0.203:7800"
admin = "127.0.0.203:7801"
admin_token_file = "/run/credentials/rein-pshift-controller.service/admin.token"
period_s = 5
intervals = 5

[[servers]]
name = "s1"
capacity_iops = 20000

[[buckets]]
name = "gold"
reservation_iops = 1000
EOF
mark rein-pshift-controller.service
check "systemctl start rein-pshift-controller.service" "systemctl start rein-pshift-controller.service"
expect "rein-pshift-controller.service is active" '^active$' "$(ns systemctl is-active rein-pshift-controller.service || true)"
expect "its readiness and status came over sd_notify" '^notify listening' \
  "$(prop rein-pshift-controller.service Type) $(prop rein-pshift-controller.service StatusText)"
dynamic_user rein-pshift-controller.service
expect "GET /metrics without the token is refused" '^401$' "$(http http://127.0.0.203:7801/metrics)"
expect "GET /metrics with the token" '^200$' "$(http http://127.0.0.203:7801/metrics "$token")"
# A pShift server: rein serve with [pshift], connecting to the controller.
nsh "cat > /etc/rein/rein.toml" <<'EOF2'
listen = "127.0.0.201:10809"
admin = "127.0.0.201:9180"
admin_token_file = "/run/credentials/rein-serve.service/admin.token"
data_dir = "/var/lib/rein"
scheduler = "token"
queue_depth = 1

[[exports]]
name = "vm1"
size_mb = 16
tenant = "gold"

[[tenants]]
name = "gold"

[pshift]
controller = "127.0.0.203:7800"
name = "s1"
EOF2
connected() { # connected WANT: the controller's rein_pshift_servers_connected reaches WANT within 15 s
  local i
  for i in $(seq 75); do
    nsh "curl -s -H \"Authorization: Bearer \$(cat $token)\" http://127.0.0.203:7801/metrics | grep -qx 'rein_pshift_servers_connected $1'" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
check "systemctl start rein-serve.service, a pShift server of the controller" "systemctl start rein-serve.service"
if connected 1; then pass "the server s1 connects (rein_pshift_servers_connected 1)"; else fail "the server s1 connects (rein_pshift_servers_connected 1)"; fi
reloaded rein-pshift-controller.service 'reload'
stopped_in_time rein-pshift-controller.service
nsh "mkdir -p /etc/systemd/system/rein-pshift-controller.socket.d
printf '[Socket]\nListenStream=\nListenStream=127.0.0.203:7800\n' > /etc/systemd/system/rein-pshift-controller.socket.d/address.conf"
ns systemctl daemon-reload
check "systemctl start rein-pshift-controller.socket" "systemctl start rein-pshift-controller.socket"
if connected 1 && [ "$(ns systemctl is-active rein-pshift-controller.service || true)" = active ]; then
  pass "the server's reconnection starts the controller through the socket, and s1 is connected"
else
  fail "the server's reconnection starts the controller through the socket, and s1 is connected" \
    "$(ns journalctl --no-pager -q -n 12 -o cat 2>&1 || true)"
fi
check "systemctl stop rein-pshift-controller.socket rein-pshift-controller.service rein-serve.service" \
  "systemctl stop rein-pshift-controller.socket rein-pshift-controller.service rein-serve.service"
expect "the controller stopped cleanly" '^success 0$' \
  "$(prop rein-pshift-controller.service Result) $(prop rein-pshift-controller.service ExecMainStatus)"
log_errors rein-pshift-controller.service

# --- rein serve: an existing image elsewhere, a block device (docs/operations.md, "Exports outside
# /var/lib/rein") --------------------------------------------------------------------------------------
# Each first under the unit as shipped (the start must fail, naming the export, the path and what to add),
# then with the runbook's drop-in, each of whose lines is shown needed by a start without it.
say "rein-serve.service: an image in /srv, a block device ..."
serve_one() { # serve_one PATH [SIZE-MB]: rein.toml serving PATH as export x, at its own size (no size_mb) or created
  nsh "cat > /etc/rein/rein.toml" <<EOF
listen = "127.0.0.201:10809"
data_dir = "/var/lib/rein"

[[exports]]
name = "x"
path = "$1"
tenant = "gold"${2:+
size_mb = $2}

[[tenants]]
name = "gold"
EOF
}
dropin() { # dropin NAME [LINE...]: rein-serve.service.d/NAME.conf of [Service] and the lines (none: removed)
  local f=/etc/systemd/system/rein-serve.service.d/$1.conf
  shift
  if [ $# = 0 ]; then ns rm -f "$f"; else { echo '[Service]'; printf '%s\n' "$@"; } | ns bash -c "cat > $f"; fi
  ns systemctl daemon-reload
}
refused() { # refused WHAT PATTERN: `systemctl start rein-serve` fails, and the unit's log has a line matching PATTERN
  local log="" line="" i
  mark rein-serve.service
  if nsh "systemctl start rein-serve.service" >/dev/null 2>&1; then
    fail "$1: systemctl start rein-serve.service fails" "$(log_since rein-serve.service)"
  else
    for i in $(seq 20); do
      log+=$(log_since rein-serve.service)$'\n'
      line=$(printf '%s' "$log" | grep -E -m1 -- "$2" || true)
      [ -z "$line" ] || break
      sleep 0.1
    done
    if [ -n "$line" ]; then pass "$1: the start fails, saying: $line"; else fail "$1: the start fails, its log matching /$2/" "$log"; fi
  fi
  ns systemctl stop rein-serve.service 2>/dev/null || true # not restarted (Restart=on-failure)
  ns systemctl reset-failed rein-serve.service 2>/dev/null || true
}
roundtrip() { # roundtrip WHAT: 1 MiB written to export x at 1 MiB and read back (nbdcopy)
  check "$1" "head -c 1048576 /dev/urandom > /tmp/x.data && nbdcopy /tmp/x.data nbd://127.0.0.201:10809/x && nbdcopy nbd://127.0.0.201:10809/x - | head -c 1048576 | cmp - /tmp/x.data"
}

img=/srv/rein-check/vm.img
check "an operator's image before the start: $img, 16 MiB, root's (0644), 1 MiB of data" \
  "mkdir -p /srv/rein-check && head -c 1048576 /dev/urandom > /tmp/img.data && cp /tmp/img.data $img && truncate -s 16M $img"
serve_one "$img"
refused "root's image under the unit as shipped" \
  "^error: export x: $img: open failed: Permission denied .*SupplementaryGroups=.*ReadWritePaths="
check "the image's group may write it: groupadd --system rein-images, chgrp, chmod g+rw" \
  "groupadd --system rein-images && chgrp rein-images $img && chmod g+rw $img"
dropin images "SupplementaryGroups=rein-images"
refused "with SupplementaryGroups=rein-images alone" "^error: export x: $img: open failed: Read-only file system .*ReadWritePaths="
dropin images "ReadWritePaths=/srv/rein-check"
refused "with ReadWritePaths=/srv/rein-check alone" "^error: export x: $img: open failed: Permission denied .*SupplementaryGroups="
dropin images "ReadWritePaths=/srv/rein-check" "SupplementaryGroups=rein-images"
check "systemctl start rein-serve.service (ReadWritePaths=/srv/rein-check, SupplementaryGroups=rein-images)" \
  "systemctl start rein-serve.service"
check "nbdinfo reads export x (16 MiB), and it has the image's data (nbdcopy)" \
  "nbdinfo --size nbd://127.0.0.201:10809/x | grep -qx 16777216 && nbdcopy nbd://127.0.0.201:10809/x - | head -c 1048576 | cmp - /tmp/img.data"
roundtrip "a client writes 1 MiB to the image and reads it back"
check "the bytes are in $img" "head -c 1048576 $img | cmp - /tmp/x.data"
stopped_in_time rein-serve.service
dropin images

if [ -n "$loop" ]; then
  serve_one "$loop"
  refused "the block device $loop under the unit as shipped" "^error: export x: $loop: does not exist .*PrivateDevices=no"
  # Each line of the drop-in left out once. Without any DeviceAllow= systemd 252 sets no device policy
  # (the service could open every device of its groups): one naming another device shows it in force.
  blk=("PrivateDevices=no" "DeviceAllow=$loop rw" "SupplementaryGroups=disk")
  dropin blk "${blk[1]}" "${blk[2]}"
  refused "without ${blk[0]}" "^error: export x: $loop: does not exist .*PrivateDevices=no"
  dropin blk "${blk[0]}" "DeviceAllow=/dev/null rw" "${blk[2]}"
  refused "with DeviceAllow=/dev/null rw in place of ${blk[1]}" "^error: export x: $loop: open failed: Operation not permitted .*DeviceAllow="
  dropin blk "${blk[0]}" "${blk[1]}"
  refused "without ${blk[2]}" "^error: export x: $loop: open failed: Permission denied .*SupplementaryGroups="
  dropin blk "${blk[@]}"
  check "systemctl start rein-serve.service (${blk[*]})" "systemctl start rein-serve.service"
  check "nbdinfo reads export x, the device's 16 MiB" "nbdinfo --size nbd://127.0.0.201:10809/x | grep -qx 16777216"
  roundtrip "a client writes 1 MiB to the block device and reads it back"
  check "the bytes are on $loop" "head -c 1048576 $loop | cmp - /tmp/x.data"
  # The reload's --check-config, beside the server that holds the device's O_EXCL claim, takes the claim
  # as the running server's (preflight::server_holding, through /proc under the unit's sandbox).
  reloaded rein-serve.service '^configuration reloaded' "the device served, its claim held by the server"
  stopped_in_time rein-serve.service
  # A device named through a link, as an LVM volume's /dev/VG/LV (-> ../dm-N): systemd resolves the
  # link of DeviceAllow= when the unit starts, rein serve opens and claims the device it names.
  nsh "mkdir -p /dev/rein-vg && ln -sfn ../${loop#/dev/} /dev/rein-vg/lv"
  serve_one /dev/rein-vg/lv
  dropin blk "${blk[0]}" "DeviceAllow=/dev/rein-vg/lv rw" "${blk[2]}"
  check "through a link, /dev/rein-vg/lv -> $loop, also in DeviceAllow=: systemctl start rein-serve.service" \
    "systemctl start rein-serve.service && nbdinfo --size nbd://127.0.0.201:10809/x | grep -qx 16777216 && nbdcopy nbd://127.0.0.201:10809/x - | head -c 1048576 | cmp - /tmp/x.data"
  stopped_in_time rein-serve.service
  dropin blk
fi

# --- an LVM logical volume: /dev/VG/lv -> ../dm-N, of group disk (udev's rules) ------------------------
if [ -z "$lvm_skip" ]; then
  lv=/dev/$vg/lv dm=/dev/dm-${lvdev#*:}
  check "the nodes as udev makes them: $dm (root:disk 0660), $lv and /dev/mapper/$vg-lv -> ../${dm#/dev/}, $pvloop" \
    "mknod -m 660 $dm b ${lvdev%%:*} ${lvdev#*:} && mknod -m 660 $pvloop b ${pvdev%%:*} ${pvdev#*:} && chgrp disk $dm $pvloop && mkdir -p /dev/$vg /dev/mapper && ln -s ../${dm#/dev/} $lv && ln -s ../${dm#/dev/} /dev/mapper/$vg-lv"
  serve_one "$lv"
  refused "the logical volume $lv under the unit as shipped" "^error: export x: $lv: does not exist .*PrivateDevices=no"
  dropin lvm "PrivateDevices=no" "DeviceAllow=$pvloop rw" "SupplementaryGroups=disk"
  refused "with DeviceAllow= of the volume group's disk ($pvloop) in place of the volume's" \
    "^error: export x: $lv: open failed: Operation not permitted .*DeviceAllow="
  dropin lvm "PrivateDevices=no" "DeviceAllow=$lv rw"
  refused "without SupplementaryGroups=disk" "^error: export x: $lv: open failed: Permission denied .*SupplementaryGroups="
  dropin lvm "PrivateDevices=no" "DeviceAllow=$lv rw" "SupplementaryGroups=disk"
  check "systemctl start rein-serve.service (PrivateDevices=no, DeviceAllow=$lv rw, SupplementaryGroups=disk)" \
    "systemctl start rein-serve.service"
  check "nbdinfo reads export x, the volume's 16 MiB" "nbdinfo --size nbd://127.0.0.201:10809/x | grep -qx 16777216"
  roundtrip "a client writes 1 MiB to the logical volume and reads it back"
  check "the bytes are on $dm" "head -c 1048576 $dm | cmp - /tmp/x.data"
  stopped_in_time rein-serve.service
  dropin lvm "PrivateDevices=no" "DeviceAllow=block-device-mapper rw" "SupplementaryGroups=disk"
  check "with DeviceAllow=block-device-mapper rw (every device-mapper device) in place of the volume's" \
    "systemctl start rein-serve.service && nbdinfo --size nbd://127.0.0.201:10809/x | grep -qx 16777216 && systemctl stop rein-serve.service"
  # The volume group's disk is an LVM member: the O_EXCL claim refuses it.
  serve_one "$pvloop"
  dropin lvm "PrivateDevices=no" "DeviceAllow=$pvloop rw" "SupplementaryGroups=disk"
  refused "the volume group's disk $pvloop, held by the volume" "^error: export x: $pvloop: is a block device in use by the system"
  dropin lvm
fi

# --- an image rein serve creates (size_mb) in a directory outside /var/lib/rein -------------------------
# The dynamic user's uid is not fixed: the image must be opened by the next run's uid through its group.
say "rein-serve.service: an image it creates in /srv ..."
new=/srv/rein-new/vm.img
serve_uid() { nsh "awk '/^Uid:/ {print \$2}' /proc/$(prop rein-serve.service MainPID)/status" 2>/dev/null || true; }
hold_uid() { # hold_uid UID: a user and group of that id, so that rein-serve's next dynamic user has another
  nsh "echo 'rein-held$1:x:$1:$1::/:/usr/sbin/nologin' >> /etc/passwd && echo 'rein-held$1:x:$1:' >> /etc/group"
}
check "a directory for new images, root's (0755): /srv/rein-new, without $new" "mkdir /srv/rein-new && ! test -e $new"
serve_one "$new" 16
refused "an image to create under the unit as shipped" "^error: export x: $new: create failed: Read-only file system .*ReadWritePaths="
newdropin=("ReadWritePaths=/srv/rein-new" "SupplementaryGroups=rein-images" "UMask=0007")
dropin new "${newdropin[@]}"
refused "in root's directory, with ${newdropin[*]}" "^error: export x: $new: create failed: Permission denied .*directory.*setgid"
check "the directory's group may write it and passes it to new files: chgrp rein-images, chmod 2775" \
  "chgrp rein-images /srv/rein-new && chmod 2775 /srv/rein-new"
mark rein-serve.service
check "systemctl start rein-serve.service (${newdropin[*]})" "systemctl start rein-serve.service"
expect "its log says it created the image" "created a new, empty image.*$new" "$(log_since rein-serve.service | grep -m1 created || true)"
uid1=$(serve_uid)
expect "the image: the dynamic user's (uid $uid1), group rein-images, mode 0660, 16 MiB" "^$uid1 rein-images 660 16777216\$" \
  "$(ns stat -c '%u %G %a %s' $new 2>&1 || true)"
roundtrip "a client writes 1 MiB to the new image and reads it back"
stopped_in_time rein-serve.service
hold_uid "$uid1"
check "systemctl start rein-serve.service again, its uid $uid1 taken meanwhile" "systemctl start rein-serve.service"
uid2=$(serve_uid)
if [ -n "$uid2" ] && [ "$uid2" != "$uid1" ]; then pass "it runs under another uid, $uid2"; else fail "it runs under another uid than $uid1: '$uid2'"; fi
check "it opened the image of uid $uid1, the client's data in it (nbdcopy)" \
  "nbdcopy nbd://127.0.0.201:10809/x - | head -c 1048576 | cmp - /tmp/x.data"
stopped_in_time rein-serve.service
# Without UMask=0007, the image is made with the default 0022: its group may not write it, and the next
# uid may not open it.
ns rm -f "$new"
dropin new "${newdropin[0]}" "${newdropin[1]}"
check "without ${newdropin[2]}: systemctl start rein-serve.service creates it anew" "systemctl start rein-serve.service"
uid3=$(serve_uid)
expect "the image: mode 0640 (UMask=0022, systemd's default)" "^$uid3 rein-images 640\$" "$(ns stat -c '%u %G %a' $new 2>&1 || true)"
ns systemctl stop rein-serve.service || true
hold_uid "$uid3"
refused "... and the next run, under another uid, cannot open it" "^error: export x: $new: open failed: Permission denied .*g\+w.*UMask="
# In a directory that is not setgid, the image gets the group of the dynamic user that made it.
check "the directory not setgid (chmod g-s), without the image" "chmod g-s /srv/rein-new && rm $new"
dropin new "${newdropin[@]}"
check "with ${newdropin[*]}: systemctl start rein-serve.service creates it anew" "systemctl start rein-serve.service"
uid4=$(serve_uid)
expect "the image: the dynamic user's own group (gid $uid4), mode 0660" "^$uid4 $uid4 660\$" "$(ns stat -c '%u %g %a' $new 2>&1 || true)"
ns systemctl stop rein-serve.service || true
hold_uid "$uid4"
refused "... and the next run, under another uid, cannot open it" \
  "^error: export x: $new: open failed: Permission denied .*its group is not one of the service's.*setgid"
dropin new

w=$(unit_warnings)
if [ -z "$w" ]; then pass "no warning of systemd's about a unit in the whole run"; else fail "no warning of systemd's about a unit in the whole run" "$w"; fi
if [ ${#failed[@]} = 0 ]; then
  say "PASS ($checks checks)"
else
  say "FAIL (${#failed[@]} of $checks checks failed):"
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
