#!/bin/sh
# dist.sh ARCH DESCRIBE COMMIT OUT: build ckptfs for linux/ARCH (amd64 or
# arm64), static (CGO_ENABLED=0), stamped with DESCRIBE (git describe) and
# COMMIT, and package it into OUT as
#   ckptfs-DESCRIBE-linux-ARCH.tar.gz  the binary, README and example units
#   ckptfs_DEBVERSION_ARCH.deb         /usr/bin/ckptfs (mount -t fuse.ckptfs
#                                      finds it there through fuse3's
#                                      mount.fuse), examples in
#                                      /usr/share/doc/ckptfs/examples
#   ckptfs-PEP440-py3-none-...whl      the binary as the wheel's script
# Run by `make dist`; needs Go, tar, dpkg-deb and python3.
set -eu
[ $# -eq 4 ] || { echo "usage: $0 ARCH DESCRIBE COMMIT OUT" >&2; exit 2; }
arch=$1 describe=$2 commit=$3 out=$4
go=${GO:-go}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
case $arch in amd64|arm64) ;; *) echo "dist.sh: $arch: want amd64 or arm64" >&2; exit 2;; esac
command -v dpkg-deb >/dev/null || { echo "dist.sh: dpkg-deb not found (apt-get install dpkg)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bin=$work/ckptfs
(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch $go build -trimpath \
  -ldflags "-s -w -X main.version=$describe -X main.commit=$commit" -o "$bin" ./cmd/ckptfs)

name=ckptfs-$describe-linux-$arch
mkdir "$work/$name"
cp "$bin" "$root/README.md" "$here/ckptfs.service" "$here/mnt-ckpts.mount" "$work/$name/"
tar -C "$work" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz" "$name"

debv=$(python3 "$here/pkgversion.py" deb "$describe")
d=$work/deb
install -D -m 0755 "$bin" "$d/usr/bin/ckptfs"
install -D -m 0644 "$root/README.md" "$d/usr/share/doc/ckptfs/README.md"
install -D -m 0644 "$here/ckptfs.service" "$d/usr/share/doc/ckptfs/examples/ckptfs.service"
install -D -m 0644 "$here/mnt-ckpts.mount" "$d/usr/share/doc/ckptfs/examples/mnt-ckpts.mount"
mkdir -p "$d/DEBIAN"
cat > "$d/DEBIAN/control" <<CONTROL
Package: ckptfs
Version: $debv
Architecture: $arch
Maintainer: ckptfs developers <ckptfs@users.noreply.github.com>
Depends: fuse3
Section: utils
Priority: optional
Installed-Size: $(du -sk "$d/usr" | cut -f1)
Description: training checkpoints as HuggingFace model directories
 ckptfs shows PyTorch DCP, Megatron torch_dist, HF-sharded safetensors and
 other training checkpoints as HuggingFace model directories, without
 copying them, through FUSE; also as mount -t fuse.ckptfs and in fstab.
CONTROL
dpkg-deb --root-owner-group -Zgzip --build "$d" "$out/ckptfs_${debv}_$arch.deb" >/dev/null

python3 "$here/wheel.py" --binary "$bin" --arch "$arch" --version "$describe" --out "$out" --readme "$root/README.md" >/dev/null
echo "dist: linux/$arch: $out/$name.tar.gz, ckptfs_${debv}_$arch.deb and a wheel"
