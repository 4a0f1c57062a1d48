#!/usr/bin/env bash
# Build the rxe lab's guest: Debian's own kernel (which has rdma_rxe as a module) and a small
# initramfs that brings up Soft-RoCE and then serves commands from the host (guest/agent.sh).
#
# Idempotent and cached under interop/.cache/ (gitignored):
#   .cache/kernel/<ver>/   the downloaded .deb, extracted with dpkg -x, with modules.dep
#   .cache/out/            vmlinuz, initramfs.gz, kver, stamp  <- what interop/lab.ts boots
# The kernel is fetched once per Debian ABI version; the initramfs is rebuilt only when its
# inputs change (this script, the guest scripts, the installed package versions, the kernel).
# A re-run with nothing changed only computes the stamp and exits.
#
# Needs the Debian packages from install-deps.sh. Runs as root or not (dpkg -x, depmod -b and
# cpio need no privileges).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
interop=$(dirname "$here")
cache=${ROCE_LAB_CACHE:-$interop/.cache}
out=$cache/out
mkdir -p "$cache/kernel" "$out"

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { printf 'build.sh: error: %s\n' "$*" >&2; exit 1; }

for tool in apt-get apt-cache dpkg dpkg-query depmod modprobe cpio gzip ldd ldconfig busybox gcc; do
  command -v "$tool" >/dev/null || die "missing '$tool' (run interop/lab/install-deps.sh)"
done

# --- 1. The kernel ---------------------------------------------------------------------------
# linux-image-amd64 is a metapackage; its dependency names the current ABI (e.g.
# linux-image-6.1.0-57-amd64). Resolving it on every run follows Debian's kernel updates.
# Without apt lists (no 'apt-get update' yet) fall back to the newest kernel already cached.
kpkg_name=$(apt-cache depends linux-image-amd64 2>/dev/null \
  | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1 || true)
if [[ -z "$kpkg_name" ]]; then
  kpkg_name=$(ls -1 "$cache/kernel" 2>/dev/null | sort -V | tail -n1 || true)
  [[ -n "$kpkg_name" ]] || die "cannot resolve the kernel package: 'apt-cache depends linux-image-amd64' found nothing (run 'apt-get update') and nothing is cached"
  log "apt-cache cannot resolve linux-image-amd64; using cached $kpkg_name"
fi
kver=${kpkg_name#linux-image-}
kdir=$cache/kernel/$kpkg_name
kroot=$kdir/root

if [[ ! -f $kdir/.done ]]; then
  log "fetching $kpkg_name"
  rm -rf "$kdir"; mkdir -p "$kdir"
  # apt-get download writes into the current directory. As root it warns that the download
  # is unsandboxed (the _apt user cannot write here); that is harmless.
  (cd "$kdir" && apt-get download -q "$kpkg_name" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  deb=$(ls "$kdir"/*.deb 2>/dev/null | head -n1 || true)
  [[ -n "$deb" ]] || die "apt-get download $kpkg_name produced no .deb"
  dpkg -x "$deb" "$kroot"
  # The .deb ships no modules.dep: generate it so 'modprobe -d' can resolve dependencies.
  depmod -b "$kroot" "$kver"
  rm -f "$deb"   # the extracted tree is all we need; saves 70 MB
  touch "$kdir/.done"
fi
[[ -f $kroot/boot/vmlinuz-$kver ]] || die "no vmlinuz in $kroot (remove $kdir and re-run)"

# --- 2. What goes into the initramfs ---------------------------------------------------------
# Guest modules: the NIC, the agent's channel (virtio_console = virtio-serial), Soft-RoCE and
# the verbs/CM user interfaces, the CRC32 that rxe's ICRC uses, and netem so that a test can
# inject loss inside the guest (the host kernel has no netem).
modules=(virtio_pci virtio_net virtio_console crc32_generic crc32-pclmul rdma_rxe rdma_ucm ib_uverbs sch_netem)

# Userspace: the RDMA test tools, the rdma/ip/tc tools of iproute2 and coreutils' timeout.
# busybox provides everything else (sh, mount, sleep, base64, wc, ...).
bins=(
  /usr/bin/ibv_devices /usr/bin/ibv_devinfo
  /usr/bin/ibv_rc_pingpong /usr/bin/ibv_uc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/ibv_srq_pingpong
  /usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_atomic_bw
  /usr/bin/ib_write_lat /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_atomic_lat
  /usr/bin/rping /usr/bin/udaddy /usr/bin/rdma_server /usr/bin/rdma_client /usr/bin/ucmatose
  /usr/bin/rdma /usr/sbin/ip /usr/sbin/tc /usr/bin/timeout
)
provider=/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
for f in "${bins[@]}" "$provider" /etc/libibverbs.d/rxe.driver; do
  [[ -e $f ]] || die "missing $f (run interop/lab/install-deps.sh)"
done
# glibc dlopen()s libgcc_s for pthread_exit/cancellation (rping needs it); ldd does not list it.
libgcc=$(ldconfig -p | sed -n 's/^[[:space:]]*libgcc_s\.so\.1 (libc6,x86-64) => //p' | head -n1)
[[ -n "$libgcc" && -e "$libgcc" ]] || die "libgcc_s.so.1 not found"

# Our own libibverbs peer (peer/verbs-peer.c: immediates, 0-byte RC/UC messages, UD at a chosen
# MTU), compiled on the host against the same Debian libibverbs the guest gets. The binary is
# named by the hash of its source and of the compiler and headers, so any change rebuilds it; the
# source is also part of the initramfs stamp below.
peer_src=$here/peer/verbs-peer.c
[[ -f /usr/include/infiniband/verbs.h ]] || die "missing /usr/include/infiniband/verbs.h (libibverbs-dev; run interop/lab/install-deps.sh)"
peer_key=$( { cat "$peer_src"; dpkg-query -W -f '${Version}\n' gcc libibverbs-dev libc6-dev 2>/dev/null; } | sha256sum | cut -c1-16)
peer_bin=$cache/peer/verbs-peer-$peer_key
if [[ ! -x $peer_bin ]]; then
  mkdir -p "$cache/peer"
  rm -f "$cache"/peer/verbs-peer-*
  gcc -O2 -Wall -Wextra -Werror -o "$peer_bin.new" "$peer_src" -libverbs || die "compiling $peer_src failed"
  mv "$peer_bin.new" "$peer_bin"
  log "compiled $peer_bin"
fi

# --- 3. Is the initramfs up to date? ---------------------------------------------------------
pkgs=$(dpkg-query -W -f '${Package}=${Version}\n' busybox-static coreutils iproute2 rdma-core \
  ibverbs-utils ibverbs-providers libibverbs1 libibverbs-dev librdmacm1 perftest rdmacm-utils libc6 gcc 2>/dev/null | sort)
stamp=$( { echo "$kver"; echo "$pkgs"; printf '%s\n' "${modules[@]}" "${bins[@]}";
           cat "$here/build.sh" "$here"/guest/* "$peer_src"; } | sha256sum | cut -d' ' -f1)
if [[ -f $out/stamp && "$(cat "$out/stamp")" == "$stamp" && -f $out/initramfs.gz && -f $out/vmlinuz ]]; then
  log "up to date ($kver, $(du -h "$out/initramfs.gz" | cut -f1) initramfs)"
  exit 0
fi

# --- 4. Assemble the root --------------------------------------------------------------------
log "building initramfs for $kver"
work=$(mktemp -d "$cache/initramfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
# usr-merged layout, as on Debian: ldd prints /lib/... paths, which then land in /usr/lib.
mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,run,tmp,root,var}
ln -s usr/bin "$root/bin"; ln -s usr/sbin "$root/sbin"
ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"

# Copy one file to the same path under $root (through the usr-merge symlinks), dereferenced.
put() {
  local src=$1 dst=${2:-$1}
  case $dst in /lib/*|/lib64/*|/bin/*|/sbin/*) dst=/usr$dst ;; esac
  [[ -e $root$dst ]] && return 0
  mkdir -p "$root$(dirname "$dst")"
  cp -L "$src" "$root$dst"
}

# Binaries, the rxe provider and libgcc_s, plus the closure of their shared libraries.
for f in "${bins[@]}" "$provider" "$libgcc"; do put "$f"; done
put "$peer_bin" /usr/bin/verbs-peer
ldd "${bins[@]}" "$peer_bin" "$provider" "$libgcc" 2>/dev/null \
  | grep -oE '/[^ :]+\.so[^ :]*' | sort -u | while read -r lib; do put "$lib"; done
put /etc/libibverbs.d/rxe.driver
mkdir -p "$root/etc/ld.so.conf.d"
cp /etc/ld.so.conf "$root/etc/"; cp /etc/ld.so.conf.d/*.conf "$root/etc/ld.so.conf.d/" 2>/dev/null || true
ldconfig -r "$root"

# busybox and its applets. Links are made only where no real tool exists, so /usr/sbin/ip is
# iproute2 (needed for 'ip -6 ... nodad', 'ip -d') and /usr/bin/timeout is coreutils'.
# (busybox ash still prefers its own applets to $PATH: guest scripts call /usr/sbin/ip.)
cp /usr/bin/busybox "$root/usr/bin/busybox"
busybox --list-full | while read -r applet; do
  case $applet in bin/*|sbin/*) applet=usr/$applet ;; esac
  [[ -e $root/$applet || -L $root/$applet ]] || { mkdir -p "$root/$(dirname "$applet")"; ln -s /usr/bin/busybox "$root/$applet"; }
done

# Kernel modules with their dependencies, then depmod on the new root so that the guest's
# (busybox) modprobe resolves them.
mkdir -p "$root/usr/lib/modules/$kver"
for m in "${modules[@]}"; do
  modprobe -d "$kroot" -S "$kver" --show-depends "$m" || die "module $m not found in $kver"
done | awk '$1 == "insmod" { print $2 }' | sort -u | while read -r ko; do
  rel=${ko#"$kroot"}; rel=${rel#/usr}
  mkdir -p "$root/usr$(dirname "$rel")"
  cp "$ko" "$root/usr$rel"
done
for f in modules.builtin modules.builtin.modinfo modules.order; do
  src=$kroot/lib/modules/$kver/$f; [[ -e $src ]] || src=$kroot/usr/lib/modules/$kver/$f
  [[ -e $src ]] && cp "$src" "$root/usr/lib/modules/$kver/"
done
depmod -b "$root" "$kver"

# The guest side of the lab.
install -m 0755 "$here/guest/init" "$root/init"
install -m 0755 "$here/guest/agent.sh" "$root/usr/sbin/lab-agent"
install -m 0755 "$here/guest/net" "$root/usr/sbin/lab-net"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$root/etc/hosts"

# --- 5. Pack ---------------------------------------------------------------------------------
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) | gzip -6 > "$work/initramfs.gz"
cp "$kroot/boot/vmlinuz-$kver" "$out/vmlinuz.new" && mv "$out/vmlinuz.new" "$out/vmlinuz"
mv "$work/initramfs.gz" "$out/initramfs.gz"
echo "$kver" > "$out/kver"
echo "$stamp" > "$out/stamp"
log "done: $out/initramfs.gz $(du -h "$out/initramfs.gz" | cut -f1) ($(du -sh "$root" | cut -f1) unpacked), kernel $kver"
