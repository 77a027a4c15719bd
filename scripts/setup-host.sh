#!/usr/bin/env bash
# Installs everything the service and its test suite need on Debian 12, as root:
# the system packages (libvirt + QEMU/KVM, slapd, btrfs/xfs/quota tools, build
# headers for libvirt-python and python-ldap) and a virtual environment in .venv
# with the project installed in editable mode. Safe to run again.
#
# With --sandbox, only what the sandbox profile uses (scripts/sandbox.sh): Python, the
# build headers of libvirt-python and python-ldap (libvirt's test driver is in the
# library itself: no daemon, no QEMU, no slapd) and the project without its test
# extras. The test command (scripts/test.sh) runs it without, for everything.
#
# With --hypervisor, what a hypervisor host other than the head node needs: libvirt,
# QEMU, nftables and iproute2, the project without its test extras, and (as in the full
# mode) the guests' network rules' boot unit and libvirt hook. Restart libvirtd after.
#
# Another apt (a fresh machine's unattended upgrades at boot) may hold the package
# lock: apt waits for it up to $APT_LOCK_WAIT seconds (default 600), then fails.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=full
if [ "${1:-}" = "--sandbox" ]; then
  MODE=sandbox
elif [ "${1:-}" = "--hypervisor" ]; then
  MODE=hypervisor
elif [ -n "${1:-}" ]; then
  echo "usage: setup-host.sh [--sandbox | --hypervisor]" >&2
  exit 2
fi

SANDBOX_SET=(
  python3 python3-venv python3-dev gcc pkg-config libvirt-dev libldap2-dev libsasl2-dev
)
PACKAGES=(
  "${SANDBOX_SET[@]}"
  libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
  qemu-system-x86 qemu-utils
  slapd ldap-utils openssl
  btrfs-progs xfsprogs quota passwd util-linux procps curl
  mmdebstrap fdisk e2fsprogs mount tar extlinux syslinux-common openssh-client dnsmasq-base
  iptables libvirt-daemon-config-nwfilter nftables kmod iproute2 systemd systemd-container wrk
  nslcd libnss-ldapd
  chromium chromium-driver
)
# A hypervisor host that is not the head node: libvirt, QEMU and what the guests' network
# rules need there (nft, ip, the project for the libvirt hook), nothing of the API's backends.
HYPERVISOR_SET=(
  "${SANDBOX_SET[@]}"
  libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils
  dnsmasq-base iptables nftables iproute2 kmod util-linux
)
if [ "$MODE" = sandbox ]; then
  PACKAGES=("${SANDBOX_SET[@]}")
elif [ "$MODE" = hypervisor ]; then
  PACKAGES=("${HYPERVISOR_SET[@]}")
fi
APT_WAIT=(-o "DPkg::Lock::Timeout=${APT_LOCK_WAIT:-600}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-host: missing system packages (${missing[*]}); run this script as root" >&2
    exit 1
  fi
  echo "setup-host: installing ${missing[*]}"
  # Packages are installed for their files; the test fixtures start the daemons
  # they need. A policy-rc.d keeps postinst scripts from starting services on
  # machines without systemd; one that was already there is left untouched.
  made_policy=""
  policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d}  # a test points it elsewhere
  if [ ! -e "$policy" ] && [ ! -d /run/systemd/system ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  # libnss-ldapd is installed for the LDAP groups test, which runs nslcd in a private
  # mount namespace: the machine's own nsswitch.conf gets no ldap entries.
  if [[ " ${missing[*]} " == *" libnss-ldapd "* ]]; then
    echo "libnss-ldapd libnss-ldapd/nsswitch multiselect " | debconf-set-selections
  fi
  apt-get "${APT_WAIT[@]}" update -q
  apt-get "${APT_WAIT[@]}" install -y -q --no-install-recommends "${missing[@]}"
  [ -n "$made_policy" ] && rm -f "$policy"
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup-host: Python 3.11 or newer is required" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
# A full install serves the sandbox too; a sandbox install has no test extras.
if [ "$MODE" != full ] && [ ! -e "$stamp" ] && [ ! -e "$stamp-sandbox" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e .
  rm -f .venv/.installed-*
  touch "$stamp-sandbox"
elif [ "$MODE" = full ] && [ ! -e "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# The guests' network rules as a property of this host, whoever starts a domain
# (host_adapters/libvirt/guest_rules_hook.py): the base table loaded at boot before libvirt, and a
# libvirt qemu hook that writes each domain's rules in its start, or aborts the start.
if [ "$MODE" != sandbox ]; then
  root=$(pwd -P)
  case "$root" in
    *[!A-Za-z0-9_./+-]*)
      echo "setup-host: the checkout's path ($root) holds characters the libvirt hook and the systemd unit cannot name; move the checkout" >&2
      exit 1 ;;
  esac
  rules=$root/.venv/bin/cloud-guest-rules
  unit=cloud-controller-guest-rules.service
  hook=$(.venv/bin/python -c 'from host_adapters.libvirt.guest_rules_hook import HOOK_PATH; print(HOOK_PATH)')
  made=$(mktemp -d)
  trap 'rm -rf "$made"' EXIT
  # Tried by hand before it goes where every start of every domain on the machine runs it.
  .venv/bin/python -c 'import sys; from host_adapters.libvirt.guest_rules_hook import hook_script; sys.stdout.write(hook_script(sys.argv[1]))' \
    "$rules" > "$made/hook"
  echo '<domain type="kvm"><name>probe</name></domain>' | sh "$made/hook" probe prepare begin - \
    || { echo "setup-host: the libvirt hook fails on a domain that is not ours; not installed" >&2; exit 1; }
  "$rules" --help > /dev/null
  hook_changed=""
  if ! cmp -s "$made/hook" "$hook"; then
    # Made beside its folder, not in it (libvirt runs whatever is executable there), then
    # renamed into place: no start runs half a script.
    install -d -m 0755 "$(dirname "$hook")"
    install -m 0755 "$made/hook" "$(dirname "$hook")/../.cloud-controller-hook.new"
    mv -f "$(dirname "$hook")/../.cloud-controller-hook.new" "$hook"
    hook_changed=1
    echo "setup-host: installed the libvirt hook $hook"
  fi
  sed "s#/opt/cloud-controller/.venv/bin/cloud-guest-rules#$rules#" "systemd/$unit" > "$made/unit"
  if ! cmp -s "$made/unit" "/etc/systemd/system/$unit"; then
    install -D -m 0644 "$made/unit" "/etc/systemd/system/$unit"
    echo "setup-host: installed /etc/systemd/system/$unit"
    if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
  fi
  # `enable` works offline too (a container whose PID 1 is not systemd).
  if command -v systemctl > /dev/null; then
    systemctl enable --quiet "$unit" 2>/dev/null \
      || echo "setup-host: warning: could not enable $unit: enable it, or nothing loads the guests' table at boot" >&2
  else
    echo "setup-host: warning: no systemctl: $unit is not enabled; load the table at boot with '$rules base'" >&2
  fi
  "$rules" base
  # libvirt-guests must not start guests at boot before an admin looks (the controller starts
  # what should run), and shuts them down rather than saving them.
  defaults=/etc/default/libvirt-guests
  for setting in ON_BOOT=ignore ON_SHUTDOWN=shutdown; do
    key=${setting%%=*}
    if grep -qx "$setting" "$defaults" 2>/dev/null; then
      continue
    elif grep -q "^$key=" "$defaults" 2>/dev/null; then
      sed -i "s/^$key=.*/$setting/" "$defaults"
    else
      echo "$setting" >> "$defaults"
    fi
  done
  if command -v systemctl > /dev/null && systemctl is-enabled --quiet nftables.service 2>/dev/null \
      && grep -Eq '^[[:space:]]*flush[[:space:]]+ruleset' /etc/nftables.conf 2>/dev/null; then
    echo "setup-host: warning: nftables.service is enabled and /etc/nftables.conf flushes the whole ruleset:" \
      "each restart of it removes the running guests' network rules ($unit loads the empty table again," \
      "so their NICs pass nothing until the controller restores them); prefer flushing only your own tables" >&2
  fi
  if [ -n "$hook_changed" ] && { pgrep -x libvirtd > /dev/null || pgrep -x virtqemud > /dev/null; }; then
    echo "setup-host: a libvirt daemon is running that started before this hook: restart it (libvirtd or virtqemud)" \
      "for the hook to run at domain starts"
  fi
fi
