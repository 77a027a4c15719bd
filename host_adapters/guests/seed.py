"""The NoCloud seed of an instance: meta-data, user-data and network-config on a `cidata` ISO.

The documents are JSON (JSON is YAML, so cloud-init reads them) and
deterministic: the hypervisor adapter compares them to detect drift.

Users, groups, home mounts and sudo rights are NOT made with cloud-init's
`users` module: it runs once per instance-id, and the instance-id must stay
fixed (a new one makes cloud-init regenerate the SSH host keys). They are made
by one POSIX sh script in `bootcmd`, which cloud-init runs on every boot with
the seed read afresh (the NoCloud cache is only trusted for seed directories,
not for a seed disk), so a rebuilt seed takes effect at the next boot.
"""

import io
import json
import re
import shlex

from common.errors import InvalidInput
from host_adapters.guests.guest import GuestSpec, GuestUser, Nic

_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DOCUMENT_NAME = re.compile(r"^[a-z][a-z0-9-]{0,63}$")

# Shell functions the generated calls use. POSIX sh only: Debian's /bin/sh is
# dash. No `set -e`: one failed step (a mount, say) must not stop the others;
# failures are logged to stderr (cloud-init's log and the console) and make
# the exit code 1, so `cloud-init status` shows them.
_FUNCTIONS = r"""set -u
state_dir=${CC_SEED_STATE_DIR:-/var/lib/cloud-controller}
sudoers_dir=${CC_SEED_SUDOERS_DIR:-/etc/sudoers.d}
rc=0

fail() { echo "cloud-controller seed: $*" >&2; rc=1; }
field() { printf '%s\n' "$1" | cut -d: -f"$2"; }

# Ids below 1000 belong to the image (Debian's system range): never changed or removed.
# A group is joinable only once it has the controller's gid here: made now, found with
# that gid, or made by an earlier seed (recorded) and given it. A group of the image with
# the same name and another gid (RHEL's ssh_keys or stapdev, say) is left alone, and no
# user joins it: membership would give the image's rights, not the cluster group's.
joinable=" "
ensure_group() {  # NAME GID
  cur=$(getent group "$1" | cut -d: -f3)
  if [ -z "$cur" ]; then
    groupadd -g "$2" "$1" || { fail "cannot add group $1 with gid $2"; return 0; }
  elif [ "$cur" != "$2" ]; then
    if [ "$cur" -lt 1000 ] || ! recorded group "$1"; then
      fail "group $1 exists in this image with gid $cur, not the cluster's gid $2: skipped, no user joins it"
      return 0
    fi
    groupmod -g "$2" "$1" || { fail "cannot set gid $2 of group $1"; return 0; }
  fi
  joinable="$joinable$1 "
}

recorded() {  # KIND NAME: whether an earlier seed's script made it
  [ -r "$state_dir/provisioned" ] && grep -qxF -- "$1 $2" "$state_dir/provisioned"
}

joinable_groups() {  # USER GROUPS: sets $kept to the comma-separated GROUPS that are joinable
  kept=""
  old_ifs=$IFS; IFS=,
  for g in $2; do
    case "$joinable" in
      *" $g "*) kept="$kept${kept:+,}$g" ;;
      *) fail "user $1 not added to group $g: the guest has no group $g with the cluster's gid" ;;
    esac
  done
  IFS=$old_ifs
}

ensure_user_group() {  # NAME GID: the user's own group, unless another group has the gid already
  holder=$(getent group "$2" | cut -d: -f1)
  if [ -z "$holder" ] || [ "$holder" = "$1" ]; then ensure_group "$1" "$2"; fi
}

ensure_user() {  # NAME UID GID HOME GROUPS
  entry=$(getent passwd "$1")
  if [ -z "$entry" ]; then
    useradd -M -N -u "$2" -g "$3" -d "$4" -s /bin/bash "$1" || { fail "cannot add user $1"; return 0; }
  elif [ "$(field "$entry" 3)" -lt 1000 ]; then
    fail "not changing system user $1"; return 0
  else
    # Only what differs: usermod -u and -g also chown files under the home.
    [ "$(field "$entry" 3)" = "$2" ] || usermod -u "$2" "$1" || fail "cannot set uid of $1"
    [ "$(field "$entry" 4)" = "$3" ] || usermod -g "$3" "$1" || fail "cannot set gid of $1"
    [ "$(field "$entry" 6)" = "$4" ] || usermod -d "$4" "$1" || fail "cannot set home of $1"
    [ "$(field "$entry" 7)" = /bin/bash ] || usermod -s /bin/bash "$1" || fail "cannot set shell of $1"
  fi
  # '*': no password login, yet not locked ('!'), which sshd may refuse even for keys.
  joinable_groups "$1" "$5"
  usermod -p '*' -G "$kept" "$1" || fail "cannot set password field and groups of $1"
}

mount_home() {  # TAG HOME
  mkdir -p "$2" || { fail "cannot make $2"; return 0; }
  mountpoint -q "$2" && return 0
  mount -t virtiofs "$1" "$2" -o nosuid,nodev || fail "cannot mount share $1 at $2"
}

write_sudoers() {  # LINE...; sudo skips names with a dot, so the temporary file is never read
  new="$sudoers_dir/.cloud-controller.new"
  { mkdir -p "$sudoers_dir" && printf '%s\n' "$@" >"$new" && chmod 0440 "$new" &&
    mv -f "$new" "$sudoers_dir/cloud-controller"; } || fail "cannot write $sudoers_dir/cloud-controller"
}

remove_user() {  # NAME; no userdel -r: the home's files live on the head node
  entry=$(getent passwd "$1") || return 0
  if [ "$(field "$entry" 3)" -lt 1000 ]; then fail "not removing system user $1"; return 0; fi
  home=$(field "$entry" 6)
  if mountpoint -q "$home"; then umount "$home" || fail "cannot unmount $home"; fi
  userdel "$1" || fail "cannot remove user $1"
}

remove_group() {  # NAME
  entry=$(getent group "$1") || return 0
  if [ "$(field "$entry" 3)" -lt 1000 ]; then fail "not removing system group $1"; return 0; fi
  groupdel "$1" || fail "cannot remove group $1"
}

remove_stale() {  # KIND WANTED: what the last seed's script made (recorded) and this seed lacks
  [ -r "$state_dir/provisioned" ] || return 0
  while read -r kind name <&3; do
    [ "$kind" = "$1" ] || continue
    case " $2 " in *" $name "*) ;; *) "remove_$1" "$name" ;; esac
  done 3<"$state_dir/provisioned"
}

record_state() {  # LINE...: these, then every group made or kept with the cluster's gid
  { mkdir -p "$state_dir" && { printf '%s\n' "$@"; for g in $joinable; do printf 'group %s\n' "$g"; done; } \
      >"$state_dir/provisioned.new" &&
    mv -f "$state_dir/provisioned.new" "$state_dir/provisioned"; } || fail "cannot record $state_dir/provisioned"
}
"""


def _call(*words: object) -> str:
    # Names and paths are validated in guest.py already; quoting anyway keeps
    # a future validation slip from becoming root code execution in the guest.
    return " ".join(shlex.quote(str(w)) for w in words)


def _own_groups(spec: GuestSpec) -> list[GuestUser]:
    """Users who get a group named like them: their gid is no group of the spec and the name is free."""
    gids = {g.gid for g in spec.groups}
    names = {g.name for g in spec.groups}
    return [u for u in spec.users if u.gid not in gids and u.username not in names]


def _provisioned_groups(spec: GuestSpec) -> list[str]:
    return sorted({g.name for g in spec.groups} | {u.username for u in _own_groups(spec)})


def _removal_lines(spec: GuestSpec) -> list[str]:
    # First, so that the uids and gids of removed accounts are free for new ones.
    users = " ".join(u.username for u in spec.users)
    groups = " ".join(_provisioned_groups(spec))
    return ["# Remove what an earlier seed provisioned and this one no longer has.",
            _call("remove_stale", "user", users), _call("remove_stale", "group", groups)]


def _group_lines(spec: GuestSpec) -> list[str]:
    return ["# Groups with their head-node gids."] + [_call("ensure_group", g.name, g.gid) for g in spec.groups]


def _user_lines(spec: GuestSpec) -> list[str]:
    own = {u.username for u in _own_groups(spec)}
    lines = ["# Users with their head-node uid, primary gid, home and exactly these groups."]
    for u in spec.users:
        if u.username in own:
            lines.append(_call("ensure_user_group", u.username, u.gid))
        lines.append(_call("ensure_user", u.username, u.uid, u.gid, u.home, ",".join(u.groups)))
    return lines


def _mount_lines(spec: GuestSpec) -> list[str]:
    if not spec.shares:
        return []
    lines = ["# Home volumes, shared by virtiofs under the username.",
             "modprobe virtiofs || fail 'cannot load virtiofs'"]
    return lines + [_call("mount_home", s.tag, s.source_dir) for s in spec.shares]


def _sudo_lines(spec: GuestSpec) -> list[str]:
    rules = [f"{u.username} ALL=(ALL) NOPASSWD:ALL" for u in spec.users if u.sudo]
    if not rules:
        return ["# No sudo rights.", 'rm -f "$sudoers_dir/cloud-controller"']
    return ["# Sudo rights."] + [_call("write_sudoers", *rules)]


def _state_lines(spec: GuestSpec) -> list[str]:
    # Groups are recorded as the script finds them (record_state): one skipped for a
    # clash is the image's, and a later seed must never remove it.
    return [_call("record_state", *(f"user {u.username}" for u in spec.users))]


def bootcmd_script(spec: GuestSpec) -> str:
    """The script that makes the guest's users, groups, home mounts and sudo rights match `spec`."""
    header = ["# Generated by the cloud controller (host_adapters/guests/seed.py) from the instance's seed;",
              "# runs on every boot and is idempotent. Do not edit: the next seed replaces it."]
    steps = (_removal_lines, _group_lines, _user_lines, _mount_lines, _sudo_lines, _state_lines)
    body = [line for step in steps for line in step(spec)]
    return "\n".join(header) + "\n" + _FUNCTIONS + "\n" + "\n".join(body) + '\nexit "$rc"\n'


def _default_route_nic(nics: tuple[Nic, ...]) -> int | None:
    # One default route only. The public NIC (on a bridge) carries it when it
    # has a gateway: replies to traffic arriving on the public address must
    # leave by the public bridge, not through the private network's NAT.
    with_gateway = [i for i, n in enumerate(nics) if n.gateway]
    public = [i for i in with_gateway if nics[i].bridge is not None]
    return (public or with_gateway or [None])[0]


def _network_config(spec: GuestSpec) -> dict:
    """Network config version 1: eth0, eth1... in spec order, bound to their MACs, static addresses."""
    default = _default_route_nic(spec.nics)
    config = []
    for i, nic in enumerate(spec.nics):
        subnet: dict = {"type": "static", "address": f"{nic.address}/{nic.prefix}"}
        if i == default:
            subnet["gateway"] = nic.gateway
        if nic.dns:
            subnet["dns_nameservers"] = list(nic.dns)
        config.append({"type": "physical", "name": f"eth{i}", "mac_address": nic.mac, "subnets": [subnet]})
    return {"version": 1, "config": config}


def ready_marker(instance_id: str) -> str:
    """The line cloud-init's final stage prints on the guest's console at the end of every boot
    (`final_message`): the guest has finished its boot setup. Names the instance, so that the
    output of another guest's image (a copied disk) is not taken for this one's."""
    return f"cloud-controller: instance {instance_id} finished its boot setup"


def _user_data(instance_id: str, spec: GuestSpec) -> dict:
    return {
        "hostname": spec.hostname,
        "preserve_hostname": False,
        "manage_etc_hosts": True,
        "ssh_pwauth": False,
        "disable_root": True,
        # An empty list replaces the distro's `users: [default]`: no default user.
        "users": [],
        # Re-render the network config on every boot too, not only for a new
        # instance-id, so changed NICs take effect at the next boot.
        "updates": {"network": {"when": ["boot"]}},
        # A string entry: cloud-init writes it after `#!/bin/sh` and runs it.
        "bootcmd": [bootcmd_script(spec)],
        # Printed by the final stage at every boot, on the console too (controller/instances/console.py
        # reads it as `ready`). No `$`: cloud-init would take it for a variable.
        "final_message": ready_marker(instance_id),
    }


def render(instance_id: str, spec: GuestSpec) -> dict[str, str]:
    """The seed's documents as text; the same arguments give byte-identical text.

    `instance_id` must stay the same for the life of the instance.
    """
    if not isinstance(instance_id, str) or not _INSTANCE_ID.fullmatch(instance_id):
        raise InvalidInput(f"invalid instance id {instance_id!r}")

    def dump(doc: dict) -> str:
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    return {
        "meta-data": dump({"instance-id": instance_id, "local-hostname": spec.hostname}),
        "user-data": "#cloud-config\n" + dump(_user_data(instance_id, spec)),
        "network-config": dump(_network_config(spec)),
    }


def _iso9660_name(name: str) -> str:
    # Plain ISO 9660 (level 1) allows 8.3 upper-case names: "user-data" is /USERDATA.;1.
    return "".join(c for c in name.upper() if c.isalnum())[:8]


def build_iso(documents: dict[str, str]) -> bytes:
    """An ISO 9660 image labelled `cidata` with one file per document (Rock Ridge and Joliet names)."""
    import pycdlib

    short = {}
    for name in documents:
        if not _DOCUMENT_NAME.fullmatch(name):
            raise InvalidInput(f"invalid seed document name {name!r}")
        if _iso9660_name(name) in short:
            raise InvalidInput(f"seed documents {name!r} and {short[_iso9660_name(name)]!r} clash in ISO 9660")
        short[_iso9660_name(name)] = name
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident="cidata", joliet=3, rock_ridge="1.09")
    for name in sorted(documents):
        data = documents[name].encode()
        iso.add_fp(io.BytesIO(data), len(data), iso_path=f"/{_iso9660_name(name)}.;1", rr_name=name, joliet_path=f"/{name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def _documents(iso) -> dict[str, str]:
    label = iso.pvd.volume_identifier.decode("ascii", "replace").strip()
    if label.lower() != "cidata":
        raise InvalidInput(f"not a NoCloud seed: volume label {label!r}")
    if iso.has_rock_ridge():
        key, decode = "rr_path", lambda rec: rec.rock_ridge.name().decode()
    elif iso.has_joliet():
        key, decode = "joliet_path", lambda rec: rec.file_identifier().decode("utf-16_be").split(";")[0]
    else:
        raise InvalidInput("seed ISO has neither Rock Ridge nor Joliet names")
    documents = {}
    for rec in iso.list_children(**{key: "/"}):
        if rec.is_dot() or rec.is_dotdot() or not rec.is_file():
            continue
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, **{key: "/" + decode(rec)})
        documents[decode(rec)] = out.getvalue().decode()
    missing = {"meta-data", "user-data"} - documents.keys()
    if missing:
        raise InvalidInput(f"not a NoCloud seed: no {', '.join(sorted(missing))}")
    return documents


def read_iso(data: bytes) -> dict[str, str]:
    """The documents of a seed made by build_iso (or cloud-localds); InvalidInput if it is none."""
    import pycdlib

    iso = pycdlib.PyCdlib()
    # pycdlib fails on corrupt images with its own errors but also with
    # KeyError, IndexError, struct.error...: all of them mean "not a seed".
    try:
        iso.open_fp(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001
        raise InvalidInput(f"not an ISO 9660 image: {type(e).__name__}: {e}") from None
    try:
        return _documents(iso)
    except InvalidInput:
        raise
    except Exception as e:  # noqa: BLE001
        raise InvalidInput(f"unreadable seed ISO: {type(e).__name__}: {e}") from None
    finally:
        iso.close()
