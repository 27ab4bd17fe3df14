#!/bin/sh
# Builds the sparkgate test host's file system view and becomes its init. Run by spark01.py as
#   nsenter --net=/run/netns/sg-NAME unshare --uts --ipc --mount --pid --fork ... hostinit.sh ROOTFS RUNDIR NAME
# so it starts as pid 1 of a fresh pid namespace with a private mount namespace: every mount below vanishes
# with the host's last process, and none of them is ever visible from the root mount namespace.
set -eu
rootfs=$1 run=$2 name=$3
root=$run/merged

hostname "$name"
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$run/upper,workdir=$run/work" "$root"

# /proc of this pid namespace (ps sees only the host), with the HostSpec's files over the ones that must lie.
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
for f in meminfo version modules; do  # a kernel without module support has no /proc/modules
    [ -f "$run/proc/$f" ] && [ -e "$root/proc/$f" ] && mount --bind -o ro "$run/proc/$f" "$root/proc/$f"
done
mount --bind -o ro "$run/proc/osrelease" "$root/proc/sys/kernel/osrelease"
[ -d "$run/proc/driver" ] && mount --bind -o ro "$run/proc/driver" "$root/proc/driver"

# A minimal /dev: sshd needs null, urandom and a private devpts for its ptys.
mount -t tmpfs -o nosuid,mode=755,size=1m tmpfs "$root/dev"
mknod -m 666 "$root/dev/null" c 1 3
mknod -m 666 "$root/dev/zero" c 1 5
mknod -m 666 "$root/dev/full" c 1 7
mknod -m 666 "$root/dev/random" c 1 8
mknod -m 666 "$root/dev/urandom" c 1 9
mknod -m 666 "$root/dev/tty" c 5 0
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"

mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs "$root/run"
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/tmp"

# Paths of this machine, read-only at the same path (HostSpec.binds: e.g. a venv mounted into containers).
if [ -f "$run/binds" ]; then
    while read -r p; do
        mkdir -p "$root$p" && mount --bind -o ro "$p" "$root$p"
    done < "$run/binds"
fi

# dockerd (HostSpec.docker) needs the cgroup hierarchies (sys stays a plain directory otherwise:
# /sys/module/nvidia/version is a file of the HostSpec) and a data root that is not on the overlay.
if [ -d "$run/docker-data" ]; then
    mkdir -p "$root/sys/fs/cgroup" "$root/var/lib/docker"
    mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
    mount --bind "$run/docker-data" "$root/var/lib/docker"
fi

[ -f "$run/hook" ] && sh -e "$run/hook" "$root"

exec chroot "$root" /usr/local/lib/sparkgate-testhost/init
