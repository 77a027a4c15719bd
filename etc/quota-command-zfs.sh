#!/bin/sh
# Sample [volumes] quota_command for homes on ZFS: each home's limit is its
# owner's user quota (userquota@UID) on the ZFS filesystem holding home_root.
#
#   install -o root -m 0755 quota-command-zfs.sh /usr/local/sbin/cloud-quota-zfs
#   [volumes] quota_backend = command
#   [volumes] quota_command = /usr/local/sbin/cloud-quota-zfs
#
# home_root should be a dataset of its own (say tank/home) that holds the homes
# and nothing else: a user quota counts the uid's files on the whole dataset.
# Not one dataset per home: the controller makes a home as a plain directory and
# deletes a volume by renaming its home aside at once, which a mount point refuses.
# The argument list (set, get, remove, check) is documented in the README
# (Quotas) and host_adapters/homes/command_quota.py. zfs is taken from PATH.
set -euf  # -f: no file name expansion of what the tools print

me=cloud-quota-zfs
fail() { printf '%s: %s\n' "$me" "$*" >&2; exit 2; }

# An absolute path of plain name characters (home_root/username or a retired home).
check_path() {
    case $1 in
        /*) ;;
        *) fail "not an absolute path: $1" ;;
    esac
    case $1 in
        *[!A-Za-z0-9._/-]* | */../* | */.. | *//*) fail "refusing the path $1" ;;
    esac
}

check_number() { # what value max_digits
    case $2 in
        '' | *[!0-9]*) fail "$1 must be a decimal number, got '$2'" ;;
    esac
    [ "${#2}" -le "$3" ] || fail "$1 is too long: $2"
}

# The ZFS filesystem holding a directory (zfs resolves a path to its dataset).
dataset_of() {
    zfs list -H -o name "$1" || fail "$1 is not on a ZFS filesystem"
}

[ $# -ge 1 ] || fail "usage: $me set|get|remove|check ARGS"
verb=$1
shift
case $verb in
    check)
        [ $# -eq 1 ] || fail "usage: $me check HOME_ROOT"
        check_path "$1"
        [ -d "$1" ] || fail "home_root $1 is not a directory"
        dataset_of "$1" >/dev/null
        ;;
    set)
        [ $# -eq 3 ] || fail "usage: $me set HOME_PATH UID BYTES"
        check_path "$1"
        check_number UID "$2" 10
        check_number BYTES "$3" 18
        ds=$(dataset_of "$(dirname "$1")")
        zfs set "userquota@$2=$3" "$ds"
        ;;
    get)
        [ $# -eq 2 ] || fail "usage: $me get HOME_PATH UID"
        check_path "$1"
        check_number UID "$2" 10
        ds=$(dataset_of "$(dirname "$1")")
        # -p: exact bytes, 0 for no quota. Two lines: the limit, then the usage.
        values=$(zfs get -Hp -o value "userquota@$2,userused@$2" "$ds")
        set -- $values
        [ $# -eq 2 ] || fail "unexpected zfs get output: $values"
        check_number userquota "$1" 19
        check_number userused "$2" 19
        printf '%s %s\n' "$1" "$2"
        ;;
    remove)
        [ $# -eq 2 ] || fail "usage: $me remove HOME_PATH UID"
        check_path "$1"
        check_number UID "$2" 10
        ds=$(dataset_of "$(dirname "$1")")
        # As quota_backend = setquota does: a uid whose volume is gone keeps the
        # smallest limit, never "none", so it cannot fill the dataset elsewhere.
        zfs set "userquota@$2=1K" "$ds"
        ;;
    *)
        fail "unknown action '$verb' (set, get, remove or check)"
        ;;
esac
