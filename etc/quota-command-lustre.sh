#!/bin/sh
# Sample [volumes] quota_command for homes on Lustre: each home's limit is its
# owner's block hard limit (lfs setquota -u) on the Lustre filesystem mounted
# at MOUNT below, which must hold home_root.
#
#   install -o root -m 0755 quota-command-lustre.sh /usr/local/sbin/cloud-quota-lustre
#   (set MOUNT in the copy)
#   [volumes] quota_backend = command
#   [volumes] quota_command = /usr/local/sbin/cloud-quota-lustre
#
# A Lustre user quota counts the uid's files on the whole filesystem, so homes
# are best a filesystem of their own. Only the block hard limit is set (soft
# limit 0: none); inode limits are left as the site set them, except on remove.
# The argument list (set, get, remove, check) is documented in the README
# (Quotas) and host_adapters/homes/command_quota.py. lfs is taken from PATH.
set -euf  # -f: no file name expansion of what the tools print

MOUNT=/lustre

me=cloud-quota-lustre
die() { echo "$me: $*" >&2; exit 2; }

# valid PATH [NAME VALUE]...: PATH under MOUNT in plain name characters, then numbers.
valid() {
    case $1 in "$MOUNT"/*) ;; *) die "$1 is not under the Lustre mount $MOUNT" ;; esac
    case $1 in *[!A-Za-z0-9._/-]* | */../* | */.. | *//*) die "refusing the path $1" ;; esac
    shift
    numbers "$@"
}

# numbers [NAME VALUE]...: each VALUE decimal, a UID of 10 digits at most, others 18.
numbers() {
    while [ $# -ge 2 ]; do
        case $2 in '' | *[!0-9]*) die "$1 must be a decimal number, got '$2'" ;; esac
        max=18
        [ "$1" != UID ] || max=10
        [ "${#2}" -le "$max" ] || die "$1 is too long: $2"
        shift 2
    done
}

usage="usage: $me set HOME_PATH UID BYTES | get|remove HOME_PATH UID | check HOME_ROOT"
# How many arguments each action takes, itself included.
case ${1:-} in
    check) count=2 ;;
    get | remove) count=3 ;;
    set) count=4 ;;
    '') die "$usage" ;;
    *) die "unknown action '$1' (set, get, remove or check)" ;;
esac
[ $# -eq "$count" ] || die "$usage"
action=$1
shift
case $action in
    check)
        valid "$1"
        [ -d "$1" ] || die "home_root $1 is not a directory"
        lfs quota -q -u 0 "$MOUNT" >/dev/null || die "lfs quota does not answer on $MOUNT"
        ;;
    set)
        valid "$1" UID "$2" BYTES "$3"
        [ $(($3 % 1024)) -eq 0 ] || die "BYTES must be whole KiB: $3"
        # lfs reads a plain number as KiB.
        lfs setquota -u "$2" -b 0 -B "$(($3 / 1024))" "$MOUNT"
        ;;
    get)
        valid "$1" UID "$2"
        out=$(lfs quota -q -u "$2" "$MOUNT")
        # -q: one row, "MOUNT kbytes quota limit grace files quota limit grace"; lfs
        # breaks it after a long MOUNT, so read the words after MOUNT wherever they are.
        # A '*' after a number marks a limit exceeded.
        words=$(printf '%s\n' "$out" | awk -v m="$MOUNT" '
            { for (i = 1; i <= NF; i++) w[++n] = $i }
            END { for (i = 1; i <= n; i++) if (w[i] == m) { print w[i + 1], w[i + 3]; exit } }')
        set -- $words
        [ $# -eq 2 ] || die "unexpected lfs quota output: $out"
        used=${1%\*}
        limit=${2%\*}
        numbers kbytes "$used" limit "$limit"
        echo "$((limit * 1024)) $((used * 1024))"
        ;;
    remove)
        valid "$1" UID "$2"
        # As quota_backend = setquota does: a uid whose volume is gone keeps the
        # smallest limits (1 KiB, 1 inode), never "none", so it cannot fill MOUNT.
        lfs setquota -u "$2" -b 0 -B 1 -i 0 -I 1 "$MOUNT"
        ;;
esac
