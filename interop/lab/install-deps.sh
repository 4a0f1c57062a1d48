#!/usr/bin/env bash
# Install the Debian packages the rxe lab needs on the host (CI, a fresh developer machine).
# Debian 12 (bookworm) or later, as root. Nothing here is installed into the guests directly:
# build.sh copies the binaries, their libraries and the kernel modules into the initramfs.
#
#   qemu-system-x86           the guests (TCG, or KVM where the CPU has VMX/SVM)
#   busybox-static            the guest's shell and core tools (static: no libc to copy)
#   rdma-core ibverbs-providers  libibverbs, the rxe provider (librxe) and its rxe.driver file
#   ibverbs-utils perftest rdmacm-utils  the test tools (ibv_*_pingpong, ib_*_bw/lat, rping)
#   iproute2                  ip/rdma/tc for the host namespace and the guests
#   tshark                    dumpcap (bridge capture) and tshark (dissection in tests)
#   kmod cpio                 depmod/modprobe -d against the extracted kernel; initramfs packing
#   util-linux                setpriv (guest processes die with the test runner)
#   coreutils bc              timeout (copied into the guest), arithmetic in scripts
#   apt dpkg                  apt-get download / dpkg -x of the guest kernel package
#   gcc libibverbs-dev        build.sh compiles our own libibverbs peer (peer/verbs-peer.c)
set -euo pipefail

[[ $(id -u) -eq 0 ]] || { echo "install-deps.sh: run as root" >&2; exit 1; }

packages=(
  qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers perftest rdmacm-utils
  iproute2 tshark kmod cpio bc util-linux coreutils gcc libc6-dev libibverbs-dev
)

export DEBIAN_FRONTEND=noninteractive
# tshark's postinst asks whether non-root users may capture; the lab runs as root: answer no.
echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections

# Skip the network entirely when everything is already there (CI re-runs on the same machine).
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps.sh: all lab packages present"
  # build.sh still resolves the kernel with apt-cache: make sure apt has its lists.
  if ! apt-cache depends linux-image-amd64 2>/dev/null | grep -q 'Depends: linux-image-'; then
    apt-get update -q
  fi
  exit 0
fi

echo "install-deps.sh: installing ${missing[*]}"
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
