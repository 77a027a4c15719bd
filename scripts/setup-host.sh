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
# Another apt (a fresh machine's unattended upgrades at boot) may hold the package
# lock: apt waits for it up to $APT_LOCK_WAIT seconds (default 600), then fails.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=full
if [ "${1:-}" = "--sandbox" ]; then
  MODE=sandbox
elif [ -n "${1:-}" ]; then
  echo "usage: setup-host.sh [--sandbox]" >&2
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
  btrfs-progs xfsprogs quota passwd util-linux curl
  mmdebstrap fdisk e2fsprogs mount tar extlinux syslinux-common openssh-client dnsmasq-base
  iptables libvirt-daemon-config-nwfilter nftables kmod iproute2 systemd wrk
  nslcd libnss-ldapd
  chromium chromium-driver
)
if [ "$MODE" = sandbox ]; then
  PACKAGES=("${SANDBOX_SET[@]}")
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
if [ "$MODE" = sandbox ] && [ ! -e "$stamp" ] && [ ! -e "$stamp-sandbox" ]; then
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
