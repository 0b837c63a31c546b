#!/usr/bin/env bash
# Builds a small QEMU guest for the vhost-user tests into DIR: DIR/vmlinuz (a Debian kernel) and
# DIR/initrd.gz (busybox, the virtio-net modules, the host's iperf3 with its libraries).
#
#   scripts/guest-image.sh DIR
#
# Idempotent and cached: when DIR holds an image built by this very script (DIR/stamp), it
# returns at once; the kernel package is kept in DIR/deb/ for rebuilds. Installs what it needs
# (busybox-static, iperf3) with apt-get when missing. Exit status: 0 built or cached, 2 a tool
# is missing and cannot be installed (the test skips), 1 anything else.
#
# The guest's /init loads the virtio-net modules (in the order of the kernel's modules.dep),
# configures eth0 from the kernel command line, prints `VQOS-GUEST-UP`, then runs an
# interactive shell on the console (ttyS0) for the test to drive:
#   vqos.ip=10.1.2.3/24   eth0's address (eth0 stays down without it)
#   vqos.name=vm1         the hostname
# Environment: VQOS_GUEST_KERNEL=linux-image-6.1.0-56-amd64 picks the kernel package (default:
# the newest linux-image-<version>-amd64 apt offers).
set -euo pipefail

dir=${1:?usage: guest-image.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
script_sum=$(sha256sum "$0" | cut -d' ' -f1)

if [[ -f $dir/stamp && -f $dir/vmlinuz && -f $dir/initrd.gz ]] &&
  [[ $(head -1 "$dir/stamp") == "$script_sum" ]]; then
  echo "guest image: cached in $dir ($(sed -n 2p "$dir/stamp"))"
  exit 0
fi

missing() { echo "guest image: $*" >&2; exit 2; }

# Tools: apt-get and dpkg-deb to fetch and unpack the kernel, a static busybox (also the
# initramfs's cpio), iperf3.
for t in apt-get apt-cache dpkg-deb depmod gzip sha256sum; do
  command -v "$t" >/dev/null || missing "$t not found"
done
need=()
if ! { [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1; }; then
  need+=(busybox-static)
fi
command -v iperf3 >/dev/null || need+=(iperf3)
updated=
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || missing "needs ${need[*]} (run as root to install)"
  apt-get update -qq && updated=1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
    missing "cannot install ${need[*]}"
fi
iperf3=$(command -v iperf3)

# The kernel package: the newest Debian linux-image-<version>-<abi>-amd64 (unsigned or signed).
newest_kernel() {
  apt-cache search --names-only '^linux-image-[0-9.]+-[0-9]+-amd64$' 2>/dev/null |
    cut -d' ' -f1 | sort -V | tail -1
}
pkg=${VQOS_GUEST_KERNEL:-}
[[ -n $pkg ]] || pkg=$(newest_kernel)
if [[ -z $pkg && -z $updated ]]; then
  apt-get update -qq && updated=1
  pkg=$(newest_kernel)
fi
[[ -n $pkg ]] || missing "apt offers no linux-image-*-amd64 package"

mkdir -p "$dir/deb"
deb=$(ls "$dir/deb/${pkg}"_*.deb 2>/dev/null | head -1 || true)
if [[ -z $deb ]]; then
  # apt's download sandbox user cannot write everywhere: download as root into a fresh folder.
  (cd "$dir/deb" && apt-get download -q "$pkg" 2>&1 | grep -v "unsandboxed" || true)
  deb=$(ls "$dir/deb/${pkg}"_*.deb 2>/dev/null | head -1 || true)
  if [[ -z $deb && -z $updated ]]; then
    apt-get update -qq && updated=1
    (cd "$dir/deb" && apt-get download -q "$pkg" 2>&1 | grep -v "unsandboxed" || true)
    deb=$(ls "$dir/deb/${pkg}"_*.deb 2>/dev/null | head -1 || true)
  fi
  [[ -n $deb ]] || missing "cannot download $pkg"
fi
# Only the newest package is kept.
find "$dir/deb" -name '*.deb' ! -path "$deb" -delete

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$deb" "$work/kernel"
modbase=$work/kernel
[[ -d $modbase/lib/modules ]] || modbase=$work/kernel/usr
kver=$(ls "$modbase/lib/modules" | head -1)
moddir=$modbase/lib/modules/$kver
# The package ships no modules.dep (its postinst runs depmod): make one in the unpacked tree.
[[ -f $moddir/modules.dep ]] || depmod -b "$modbase" "$kver"
[[ -f $moddir/modules.dep ]] || { echo "guest image: no modules.dep for $kver" >&2; exit 1; }

# The virtio-net modules with their dependencies, dependencies first (modules.dep lists every
# module a module needs; a module built into the kernel is not in it and is skipped).
order=()
declare -A seen=()
add_module() {
  local name=$1 line path deps d
  [[ -z ${seen[$name]:-} ]] || return 0
  seen[$name]=1
  line=$(grep -E "(^|/)${name}\.ko(\.xz|\.zst|\.gz)?:" "$moddir/modules.dep" | head -1 || true)
  if [[ -z $line ]]; then
    grep -qE "(^|/)${name}\.ko$" "$moddir/modules.builtin" 2>/dev/null ||
      { echo "guest image: module $name neither in modules.dep nor built in" >&2; exit 1; }
    return 0
  fi
  path=${line%%:*}
  deps=${line#*:}
  for d in $deps; do
    d=${d##*/}
    add_module "${d%%.ko*}"
  done
  order+=("$name:$path")
}
add_module virtio_pci
add_module virtio_net

root=$work/root
mkdir -p "$root"/{bin,dev,proc,sys,tmp,etc,lib/vqos}
cp /bin/busybox "$root/bin/busybox"
for entry in "${order[@]}"; do
  name=${entry%%:*}
  path=$moddir/${entry#*:}
  case $path in
  *.ko.xz) xz -dc "$path" >"$root/lib/vqos/$name.ko" ;;
  *.ko.zst) zstd -qdc "$path" >"$root/lib/vqos/$name.ko" ;;
  *.ko.gz) gzip -dc "$path" >"$root/lib/vqos/$name.ko" ;;
  *) cp "$path" "$root/lib/vqos/$name.ko" ;;
  esac
  echo "$name" >>"$root/etc/vqos-modules"
done

# iperf3 and the libraries the host's build links (same architecture: they run as they are).
mkdir -p "$root$(dirname "$iperf3")"
cp "$iperf3" "$root$iperf3"
for lib in $(ldd "$iperf3" | grep -oE '/[^ ]+'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
if [[ $(id -u) == 0 ]]; then
  chroot "$root" "$iperf3" --version >/dev/null ||
    { echo "guest image: the host's iperf3 does not run in the guest's root" >&2; exit 1; }
fi

cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /etc/vqos-modules); do insmod /lib/vqos/$m.ko || echo "VQOS-GUEST-ERROR insmod $m"; done
ip=; name=vqos-guest
for arg in $(cat /proc/cmdline); do
  case $arg in
  vqos.ip=*) ip=${arg#vqos.ip=} ;;
  vqos.name=*) name=${arg#vqos.name=} ;;
  esac
done
hostname "$name"
ip link set lo up
n=0
while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
if [ -n "$ip" ]; then
  ip addr add "$ip" dev eth0
  ip link set eth0 up
fi
echo "VQOS-GUEST-UP $name eth0=$ip"
exec setsid cttyhack sh
EOF
chmod +x "$root/init"

(cd "$root" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -6) >"$dir/initrd.gz.new"
cp "$work/kernel/boot/vmlinuz-$kver" "$dir/vmlinuz.new"
mv "$dir/initrd.gz.new" "$dir/initrd.gz"
mv "$dir/vmlinuz.new" "$dir/vmlinuz"
printf '%s\n%s, modules %s\n' "$script_sum" "$(basename "$deb")" "$(tr '\n' ' ' <"$root/etc/vqos-modules")" >"$dir/stamp"
echo "guest image: built in $dir ($(sed -n 2p "$dir/stamp"))"
