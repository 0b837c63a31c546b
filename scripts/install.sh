#!/usr/bin/env bash
# Installs vqos: the binaries (cargo install --path), the systemd unit and an example config.
# Idempotent: running it again updates the binaries and the unit and never overwrites a config
# that exists.
#
#   scripts/install.sh [--prefix /usr/local] [--no-build]     (as root)
#   DESTDIR=/tmp/stage scripts/install.sh --prefix /usr       (staging, for packages and tests)
#
# Puts  PREFIX/bin/vqosd, PREFIX/bin/vqos,
#       /etc/systemd/system/vqosd.service (ExecStart pointing at PREFIX/bin/vqosd),
#       /etc/vqos/vqosd.toml (from examples/vqosd.toml, only if absent),
# each under DESTDIR when it is set. Then: systemctl daemon-reload && systemctl enable --now vqosd
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 2 ;; esac
dest="${DESTDIR:-}"

if [ "$build" = 1 ]; then
  # --force replaces the binaries of an earlier install (idempotent); --locked: Cargo.lock.
  cargo install --locked --force --root "$dest$prefix" --path crates/vqosd
  cargo install --locked --force --root "$dest$prefix" --path crates/vqos-cli
  # cargo's record of what it installed belongs to the real root, not to a staged tree.
  if [ -n "$dest" ]; then rm -f "$dest$prefix/.crates.toml" "$dest$prefix/.crates2.json"; fi
fi

unit_dir="$dest/etc/systemd/system"
install -d -m 0755 "$unit_dir" "$dest/etc/vqos"
sed "s|/usr/local/bin/|$prefix/bin/|g" packaging/vqosd.service >"$unit_dir/vqosd.service.tmp"
chmod 0644 "$unit_dir/vqosd.service.tmp"
mv "$unit_dir/vqosd.service.tmp" "$unit_dir/vqosd.service"
if [ -e "$dest/etc/vqos/vqosd.toml" ]; then
  echo "install.sh: keeping the existing $dest/etc/vqos/vqosd.toml"
else
  # 0600: the config may name token files, etcd credentials and TLS keys' paths, and tells
  # every tenant's policy: root's only.
  install -m 0600 examples/vqosd.toml "$dest/etc/vqos/vqosd.toml"
fi
echo "install.sh: installed under ${dest:-/} (prefix $prefix)"
if [ -z "$dest" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  echo "install.sh: now: systemctl enable --now vqosd"
fi
